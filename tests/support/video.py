"""Video results made in the test, without an engine: smooth frames, and a backend answering each request with
them (what a video pool's result looks like to the doors: `frames` at `fps`, `image` the first)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from PIL import Image

from engine.events import EngineEvents
from engine.requests import CheckedRequest, GenerateRequest, GenerateResult, Timings

__all__ = ["VideoBackend", "frames", "mean_difference", "video_result"]

# A mean absolute difference per channel an H.264 4:2:0 file at CRF 18 keeps smooth frames within (measured:
# about 2; tests/serving/test_video.py says why it is not the lossless 2-level rule).
TOLERANCE = 4.0


def frames(count: int = 9, width: int = 64, height: int = 48) -> list[Image.Image]:
    """Smooth frames (gradients moving across the frame), each unlike the others."""
    x = np.linspace(0, 1, width)[None, :]
    y = np.linspace(0, 1, height)[:, None]
    made = []
    for k in range(count):
        phase = k / count
        red = 128 + 100 * np.sin(2 * np.pi * (x + phase)) * np.ones_like(y)
        green = 40 + 180 * y * np.ones_like(x)
        blue = np.full((height, width), 20.0 + 200 * phase)
        made.append(Image.fromarray(np.stack([red, green, blue], axis=-1).round().astype(np.uint8)))
    return made


def mean_difference(a: Image.Image, b: Image.Image) -> float:
    return float(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).mean())


def video_result(request: GenerateRequest, *, default_frames: int = 9, default_fps: int = 16) -> GenerateResult:
    """The result a video pool would give `request`: its frames (made here) at its rate, the request checked as
    the engine would fill it (whole numbers, defaults)."""
    made = tuple(frames(int(request.num_frames or default_frames)))
    values = {f.name: getattr(request, f.name) for f in fields(GenerateRequest)}
    values.update(
        steps=int(request.steps or 2),
        guidance=float(request.guidance if request.guidance is not None else 5.0),
        width=64,
        height=48,
        seed=int(request.seed or 0),
        num_frames=len(made),
        fps=int(request.fps or default_fps),
        sampler="UniPC",
        scheduler_options=tuple(request.scheduler_options),
    )
    checked = CheckedRequest(**values)
    return GenerateResult(
        image=made[0],
        seed=checked.seed,
        request=checked,
        timings=Timings(total=0.5),
        frames=made,
        fps=checked.fps,
        model_id="tiny-video",
    )


class VideoBackend:
    """A backend whose every generation is `video_result`; it keeps the requests it was sent (`.requests`)."""

    def __init__(self) -> None:
        self.events = EngineEvents()
        self.requests: list[GenerateRequest] = []

    def pools(self) -> tuple[()]:
        return ()

    async def generate(self, request: GenerateRequest, **kwargs: object) -> GenerateResult:
        self.requests.append(request)
        progress = kwargs.get("progress")
        if callable(progress):
            progress(1, 1)
        return video_result(request)
