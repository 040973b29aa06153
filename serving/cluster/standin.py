"""A stand-in GPU for measuring a cluster on shared CPUs (`bench.fleet --real`): a pipeline call becomes a wait.

The fleet model (bench/fleet_model.py) gives each replica a GPU of its own, so one replica's inference never
slows another's. CPU replicas sharing a machine's cores do slow each other (on 2 cores a tiny-pipeline image
took 0.38-1.45 s from run to run), and no machine here has a core per replica. So with `CLUSTER_STANDIN_GPU_S`
each replica's pipeline call (denoising and decoding) sleeps that long instead, as the model's inference takes
a fixed time: the engine still calls it under its pipeline lock with the request's slot held, so the replica
runs no second image meanwhile, and the sleep holds no core. Everything around it stays real: Serve, the
routers, preparation, the exact swap on the pipeline's weights, the disk and host caches.

The wait is split into the call's denoising steps, `seconds / steps` each, and after each the pipeline's step
callback is called as diffusers calls it: the engine's own (`engine.pipeline.inference.infer`) then reports
progress, takes a cancel at the step's end, and, with `DEVICE_SHARING=step`, hands the device to another pool's run
at the boundary (`engine.pipeline.stepshare`): the stand-in GPU is shared step by step as a GPU is, the way the
fleet model shares a replica's GPU (bench/fleet_device.py). The image answered is plain grey of the request's size
(one per seed); the latents the callback is handed are zeros of the request's latent shape (a preview of them is
flat).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput
from PIL import Image

__all__ = ["install_standin_gpu"]

_GREY = (128, 128, 128)


def install_standin_gpu(pipe: Any, seconds: float, wait: Callable[[float], None] = time.sleep) -> None:
    """Make every call of `pipe` a `wait(seconds)`, a step at a time with its step callback after each, answering
    grey images; its components and weights (which the engine swaps adapters into) are untouched.

    The pipeline's class becomes a subclass of its own with this `__call__` (Python looks a call up on the type,
    so an instance attribute would not do); everything else the engine reads of the pipeline stays as it was.
    """
    if seconds < 0:
        raise ValueError(f"a stand-in GPU's wait of {seconds} s is not accepted; accepted: 0 or more seconds")
    base = type(pipe)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> ImagePipelineOutput:
        size = (int(kwargs.get("width") or 64), int(kwargs.get("height") or 64))
        count = int(kwargs.get("num_images_per_prompt") or 1)
        steps = max(int(kwargs.get("num_inference_steps") or 1), 1)
        callback = kwargs.get("callback_on_step_end")
        self._num_timesteps = steps  # what the engine's callback reads of a call's steps, as diffusers sets it
        scale = int(getattr(self, "vae_scale_factor", 8) or 8)
        latents = torch.zeros(count, 4, size[1] // scale, size[0] // scale)
        for step in range(steps):
            wait(seconds / steps)
            if callback is not None:
                callback(self, step, None, {"latents": latents})
        return ImagePipelineOutput(images=[Image.new("RGB", size, _GREY) for _ in range(count)])

    pipe.__class__ = type(f"StandIn{base.__name__}", (base,), {"__call__": __call__, "standin_gpu_s": seconds})
