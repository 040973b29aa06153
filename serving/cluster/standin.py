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

A video pipeline (Wan's: its family names its denoiser's blocks) waits a piece at a time as the engine shares a
video: each step `video.step_s`, split evenly over its guidance passes (`FamilySpec.guidance_passes` with guidance
on, as diffusers' `WanPipeline` runs them) through its transformer's blocks, then `video.chunk_s` per latent frame
of its VAE decode. Each wait runs inside a call of the real block (or of the VAE's decoder), whose forward is the
wait: the engine's forward pre-hooks on them (`engine.pipeline.inference._boundaries`) make its boundaries, one a
piece, through the device's real scheduler, not one wait per call. The frames answered are grey.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput
from diffusers.pipelines.wan.pipeline_output import WanPipelineOutput
from PIL import Image

from engine.families.spec import FamilySpec
from engine.pipeline.inference import latent_frames

__all__ = ["VideoWaits", "install_standin_gpu"]

_GREY = (128, 128, 128)


@dataclass(frozen=True)
class VideoWaits:
    """A video's stand-in device time: seconds per denoising step (split evenly over its pieces), and per latent
    frame of its VAE decode."""

    step_s: float
    chunk_s: float


def install_standin_gpu(
    pipe: Any,
    seconds: float,
    wait: Callable[[float], None] = time.sleep,
    *,
    family: FamilySpec | None = None,
    video: VideoWaits | None = None,
) -> None:
    """Make every call of `pipe` a `wait(seconds)`, a step at a time with its step callback after each, answering
    grey images; its weights (which the engine swaps adapters into) are untouched. A video pipeline of `family`
    waits `video`'s times a piece at a time instead (module docstring); its blocks' and VAE decoder's forwards
    become those waits (nothing else calls them).

    The pipeline's class becomes a subclass of its own with this `__call__` (Python looks a call up on the type,
    so an instance attribute would not do); everything else the engine reads of the pipeline stays as it was.
    """
    if seconds < 0 or (video is not None and min(video.step_s, video.chunk_s) < 0):
        raise ValueError(f"a stand-in GPU's wait of {seconds} s, {video} is not accepted; accepted: 0 or more seconds")
    base = type(pipe)
    blocks = _blocks(pipe, family)
    if blocks and video is not None:
        _wait_in(blocks, pipe.vae.decoder, wait, video.step_s, video.chunk_s, family)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        size = (int(kwargs.get("width") or 64), int(kwargs.get("height") or 64))
        count = int(kwargs.get("num_images_per_prompt") or 1)
        steps = max(int(kwargs.get("num_inference_steps") or 1), 1)
        callback = kwargs.get("callback_on_step_end")
        self._num_timesteps = steps  # what the engine's callback reads of a call's steps, as diffusers sets it
        if blocks and video is not None:
            return _video_call(self, blocks, kwargs, size, steps, family)
        scale = int(getattr(self, "vae_scale_factor", 8) or 8)
        latents = torch.zeros(count, 4, size[1] // scale, size[0] // scale)
        for step in range(steps):
            wait(seconds / steps)
            if callback is not None:
                callback(self, step, None, {"latents": latents})
        return ImagePipelineOutput(images=[Image.new("RGB", size, _GREY) for _ in range(count)])

    pipe.__class__ = type(f"StandIn{base.__name__}", (base,), {"__call__": __call__, "standin_gpu_s": seconds})


def _blocks(pipe: Any, family: FamilySpec | None) -> list[torch.nn.Module]:
    """The blocks of a video family's denoiser (Wan's transformer's), where the engine hooks its boundaries."""
    if family is None or not family.denoiser_blocks or getattr(getattr(pipe, "vae", None), "decoder", None) is None:
        return []
    return list(getattr(getattr(pipe, family.denoiser, None), family.denoiser_blocks, None) or [])


def _wait_in(
    blocks: list[torch.nn.Module],
    decoder: torch.nn.Module,
    wait: Callable[[float], None],
    step_s: float,
    chunk_s: float,
    family: FamilySpec | None,
) -> None:
    """Each block's forward waits its share of a step (a guidance pass's), the decoder's a chunk's."""
    passes = family.guidance_passes if family is not None else 1

    def piece(module: torch.nn.Module, seconds: float) -> None:
        def forward(hidden: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
            wait(seconds)
            return hidden

        module.forward = forward

    for block in blocks:
        piece(block, step_s / (passes * len(blocks)))
    piece(decoder, chunk_s)


def _video_call(
    pipe: Any, blocks: list[torch.nn.Module], kwargs: dict, size: tuple[int, int], steps: int, family: FamilySpec | None
) -> WanPipelineOutput:
    """One video call: each step its passes through the blocks (with guidance on, as diffusers' `WanPipeline`), the
    step callback after it; then a decoder call per latent frame (the engine's `decode_chunks`)."""
    callback = kwargs.get("callback_on_step_end")
    guided = float(kwargs.get("guidance_scale") or 1.0) > 1.0
    passes = family.guidance_passes if guided and family is not None else 1
    frames = int(kwargs.get("num_frames") or 1)
    chunks = latent_frames(pipe, frames)
    # Zeros of the latents' shape (a preview of them is flat); nothing reads what the waiting blocks pass on.
    scale = int(getattr(pipe, "vae_scale_factor_spatial", 8) or 8)
    channels = int(getattr(pipe.vae.config, "z_dim", 16))
    hidden = torch.zeros(1, channels, chunks, size[1] // scale, size[0] // scale)
    # Without guidance a step is one pass, so half a guided step's time (each block's wait is a pass's share).
    for step in range(steps):
        for _ in range(passes):
            for block in blocks:
                block(hidden)
        if callback is not None:
            callback(pipe, step, None, {"latents": hidden})
    for _ in range(chunks):
        pipe.vae.decoder(hidden)
    # diffusers' `frames[0]` with output_type="pil": the video's frames (its annotation says a tensor).
    grey: Any = [[Image.new("RGB", size, _GREY) for _ in range(frames)]]
    return WanPipelineOutput(frames=grey)
