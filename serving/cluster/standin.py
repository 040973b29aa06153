"""A stand-in GPU for measuring a cluster on shared CPUs (`bench.fleet --real`): a pipeline call becomes a wait.

The fleet model (bench/fleet_model.py) gives each replica a GPU of its own, so one replica's inference never
slows another's. CPU replicas sharing a machine's cores do slow each other (on 2 cores a tiny-pipeline image
took 0.38-1.45 s from run to run), and no machine here has a core per replica. So with `CLUSTER_STANDIN_GPU_S`
each replica's pipeline call (denoising and decoding) sleeps that long instead, as the model's inference takes
a fixed time: the engine still calls it under its pipeline lock with the request's slot held, so the replica
runs no second image meanwhile, and the sleep holds no core. Everything around it stays real: Serve, the
routers, preparation, the exact swap on the pipeline's weights, the disk and host caches.

The image answered is plain grey of the request's size (one per seed); progress and previews are not reported
during the wait, and a cancel takes effect when it ends (`engine.pipeline.inference.infer` checks it then).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from diffusers.pipelines.pipeline_utils import ImagePipelineOutput
from PIL import Image

__all__ = ["install_standin_gpu"]

_GREY = (128, 128, 128)


def install_standin_gpu(pipe: Any, seconds: float, wait: Callable[[float], None] = time.sleep) -> None:
    """Make every call of `pipe` a `wait(seconds)` answering grey images; its components and weights (which the
    engine swaps adapters into) are untouched.

    The pipeline's class becomes a subclass of its own with this `__call__` (Python looks a call up on the type,
    so an instance attribute would not do); everything else the engine reads of the pipeline stays as it was.
    """
    if seconds < 0:
        raise ValueError(f"a stand-in GPU's wait of {seconds} s is not accepted; accepted: 0 or more seconds")
    base = type(pipe)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> ImagePipelineOutput:
        wait(seconds)
        size = (int(kwargs.get("width") or 64), int(kwargs.get("height") or 64))
        count = int(kwargs.get("num_images_per_prompt") or 1)
        return ImagePipelineOutput(images=[Image.new("RGB", size, _GREY) for _ in range(count)])

    pipe.__class__ = type(f"StandIn{base.__name__}", (base,), {"__call__": __call__, "standin_gpu_s": seconds})
