"""`/generate_video`, the named API's video endpoint: text-to-video, or image-to-video with `image`.

Its parameters are the request's fields offered to the Gradio API (`RequestField.gradio`) that a video request
reads, in their declared order, then `base`: the image endpoints' minus what only an image run takes
(`IMAGE_ONLY`: several images, a mask, a strength, further references, CLIP skip), plus the video fields
(`RequestField.video`); tests/serving/test_request_schema.py holds the signature to that. It answers the video
file (the MP4 `POST /` answers, byte for byte: `serving.video.video_file`) and the info dict.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import gradio as gr

from engine.errors import InvalidRequestError
from engine.requests import REQUEST_FIELDS, GenerateRequest, GenerateResult
from serving.errors import user_errors
from serving.handlers import Handlers
from serving.ui import formatting as fmt
from serving.ui.api_requests import LATE, api_request, read_video, windowed
from serving.ui.gradio_api import PIPELINE, generate
from serving.ui.uploads import uploaded_path
from serving.ui.video_ui import IN_CONTEXT, low_noise, saved_video
from serving.video import frame_count

__all__ = ["IMAGE_ONLY", "add_video_endpoint", "video_info", "video_parameters"]

# The request fields a video endpoint leaves out (a video is one clip from one optional image; Wan's UMT5 has no
# CLIP layers to skip).
IMAGE_ONLY = ("num_images", "mask_image", "strength", "images", "clip_skip")


# The endpoint's own argument after the declared ones: the pool.
OWN = ("base",)


def video_parameters() -> list[str]:
    """The endpoint's parameters by the request's declaration (without Gradio's `progress`): the declared Gradio
    arguments a video reads, then each field's video-only ones (`RequestField.gradio_video`: each LoRA's
    low-noise scale), then `base`, then every generation endpoint's last ones (`LATE`: each LoRA's window), then
    the video endpoint's own last ones (`RequestField.gradio_video_last`: an IC-LoRA's reference video and its
    in-context settings)."""
    declared = [name for f in REQUEST_FIELDS if f.name not in IMAGE_ONLY for name in f.gradio]
    further = [name for f in REQUEST_FIELDS for name in f.gradio_video]
    last = [name for f in REQUEST_FIELDS for name in f.gradio_video_last]
    return [*declared, *further, *OWN, *LATE, *last]


def video_info(result: GenerateResult) -> dict[str, Any]:
    """`/generate`'s info, with the video's frames, rate, length in seconds and low-noise guidance."""
    request = result.request
    return {
        **fmt.result_info(result),
        "num_frames": frame_count(result),
        "fps": result.fps,
        "duration_s": frame_count(result) / result.fps if result.fps else 0.0,
        "guidance_2": request.guidance_2,
    }


def add_video_endpoint(handlers: Handlers) -> None:
    """The hidden inputs and outputs of `/generate_video` and its wiring (inside the app's Blocks)."""
    with gr.Column(visible=False):
        # No `precision` on numbers: Gradio would round 2.5 (and True) quietly; the engine refuses them by name.
        # None: the video pool's own defaults (or the LoRAs' recommendations), whichever pool runs it; a low-noise
        # scale's None: the LoRA's scale on both transformers.
        texts = {name: gr.Textbox("") for name in ("negative_prompt", "lora", "lora_2", "scheduler", "base")}
        numbers = {name: gr.Number(1.0) for name in ("lora_scale", "lora_2_scale")}
        numbers |= {name: gr.Number(None) for name in ("steps", "guidance", "width", "height", "num_frames", "fps")}
        numbers |= {name: gr.Number(None) for name in ("guidance_2", "lora_scale_2", "lora_2_scale_2", *LATE)}
        numbers |= {name: gr.Number(None) for name in IN_CONTEXT}
        others = {"prompt": gr.Textbox(), "seed": gr.Number(-1), "scheduler_options": gr.JSON(None)}
        others["image"], others["video"] = uploaded_path(), uploaded_path()
        video, info = gr.Video(format="mp4", label="video"), gr.JSON(label="info")
        trigger = gr.Button()
    components = {**texts, **numbers, **others}
    # In the declared order (`video_parameters`), as the handler's signature takes them.
    inputs: list[Any] = [components[name] for name in video_parameters()]
    trigger.click(
        _generate_video_api(handlers),
        inputs,
        [video, info],
        api_name="generate_video",
        concurrency_id=PIPELINE,
        concurrency_limit=None,
    )


def _request(handlers: Handlers, arguments: dict[str, Any]) -> GenerateRequest:
    """The endpoint's arguments as a request, through the image endpoints' one reader (`api_request`)."""
    a = arguments
    loras = (a["lora"], a["lora_scale"], a["lora_2"], a["lora_2_scale"])
    pixels = handlers.settings.max_input_pixels
    request = api_request(
        a["prompt"], a["negative_prompt"], loras, a["steps"], a["guidance"], a["width"], a["height"], a["seed"],
        a["scheduler"], a["scheduler_options"], None, None, (a["image"], None, None, None, pixels, None),
    )  # fmt: skip
    for lora, low in (("lora", "lora_scale_2"), ("lora_2", "lora_2_scale_2")):
        if not (a[lora] or "").strip() and a[low] is not None:
            # A low-noise scale for no LoRA is refused by name, not dropped (as a window there: `windowed`).
            raise InvalidRequestError(
                f"{low}={a[low]!r} was given, but {lora} is empty: a scale for a LoRA the request does not use; "
                f"accepted: {lora} set to a LoRA, or {low} left empty"
            )
    request = low_noise(request, ((a["lora"], a["lora_scale_2"]), (a["lora_2"], a["lora_2_scale_2"])))
    request = windowed(
        request, ((a["lora"], a["lora_start"], a["lora_end"]), (a["lora_2"], a["lora_2_start"], a["lora_2_end"]))
    )
    video = {name: a[name] for name in ("num_frames", "fps", "guidance_2") if a[name] is not None}
    # An IC-LoRA's reference video (a `handle_file`), read as far as its header as POST / reads one.
    reference = read_video(a["video"], "video", pixels, handlers.settings.max_video_frames)
    # The video endpoint: an image pool is refused where the request is checked, before anything runs.
    # The in-context call's settings (`video_ui.IN_CONTEXT`, the UI's names too), None: diffusers' defaults.
    video |= {name: a[name] for name in IN_CONTEXT if a[name] is not None}
    return dataclasses.replace(request, **video, reference_video=reference, expects="video")


def _generate_video_api(handlers: Handlers) -> Callable[..., Any]:
    async def generate_video_api(
        prompt: str,
        negative_prompt: str = "",
        lora: str = "",
        lora_scale: float = 1.0,
        lora_2: str = "",
        lora_2_scale: float = 1.0,
        steps: float | None = None,
        guidance: float | None = None,
        width: float | None = None,
        height: float | None = None,
        seed: float | None = -1,
        scheduler: str = "",
        scheduler_options: dict | None = None,
        image: Any = None,
        num_frames: float | None = None,
        fps: float | None = None,
        guidance_2: float | None = None,
        lora_scale_2: float | None = None,
        lora_2_scale_2: float | None = None,
        base: str = "",
        lora_start: float | None = None,
        lora_end: float | None = None,
        lora_2_start: float | None = None,
        lora_2_end: float | None = None,
        video: Any = None,
        reference_strength: float | None = None,
        reference_downscale: float | None = None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio hands out progress)
    ) -> tuple[str, dict[str, Any]]:
        """Generate a video on a video pool (the LoRAs' base, else `base`, else the default): text-to-video, or
        image-to-video from `image` (a `handle_file`). `lora`, `lora_2`, `scheduler` and `seed` as /generate's;
        `num_frames` 4k+1 (none: the pool's default), `fps` its frames per second, `guidance_2` the low-noise
        stage's guidance on a two-stage pool (Wan 2.2 A14B), `lora_scale_2` and `lora_2_scale_2` each LoRA's
        low-noise scale there (None: its scale for both), `lora_start`/`lora_end` (`lora_2_...`) each LoRA's window
        as /generate's (on both transformers); unset numbers (None) take the pool's defaults. `video`: an IC-LoRA's
        reference video (an MP4, a `handle_file`; an LTX-2 pool only); with it, `reference_strength` (0 to 1: how
        strongly the video and the reference attend to each other) and `reference_downscale` (1 to 8: the factor
        the IC-LoRA was trained with), None: diffusers' defaults.
        Answers the MP4 (H.264, its recipe in the `comment` tag: the bytes POST / answers) and the info, with
        `num_frames`, `fps` and `duration_s`."""
        arguments = dict(locals())
        with user_errors():
            # In a thread: the input image is decoded here (the event loop serves every other client meanwhile).
            request = await asyncio.to_thread(_request, handlers, arguments)
        result: GenerateResult | None = None
        async for item in generate(handlers, request, progress, base=(base or "").strip()):
            if isinstance(item, GenerateResult):
                result = item
        assert result is not None  # the stream ends with the result, or raises
        with user_errors():
            path = await asyncio.to_thread(saved_video, result)
        return path, video_info(result)

    return generate_video_api
