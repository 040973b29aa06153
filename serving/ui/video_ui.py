"""The UI's video pieces: frames and fps beside the size (shown for a video pool, with the clip's length in
seconds at that rate), a `gr.Video` result in place of the image, each LoRA's "Low-noise scale" (shown for a
two-stage pool: Wan 2.2 A14B's `LoraSpec.scale_2`), an IC-LoRA's reference video (shown for a pool with an
in-context pipeline: LTX-2's, with its two settings under it, shown and hidden together), and the switch between
them when the base changes. A
"Low-noise scale" follows its LoRA's scale until the user moves it (the docs' "without it, `scale` applies to
both": the request then carries one scale), and keeps what a share link or a history entry set where that differs
from the scale.

A pool is a video pool by its defaults (`ModelDefaults.video`), never by its family. The input image for
image-to-video is the image panel every pool that takes an image shows (`serving.ui.inputs`); progress is the
engine's per step, as for images, and Cancel stops the run at its next step the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from gradio import processing_utils
from gradio import utils as gradio_utils

from engine.request_schema import RequestField
from engine.requests import DECLARED_FIELDS, FPS_RANGE, GenerateRequest, GenerateResult, ModelDefaults
from engine.video_input import EncodedVideo
from serving.handlers import Handlers
from serving.ui import pool_views
from serving.ui.api_requests import read_video
from serving.video import video_file

__all__ = [
    "IN_CONTEXT",
    "VideoControls",
    "clip_of",
    "follow_scale",
    "length_text",
    "low_noise",
    "low_noise_control",
    "low_noise_shown",
    "on_base",
    "preview",
    "saved_video",
    "video_controls",
    "video_request",
    "video_result",
    "wire_video",
]

# What the sliders show on an image pool (hidden there): Wan 2.1's clip.
_FRAMES, _FPS = 81, 16
# The in-context call's settings (`GenerateRequest.reference_strength`, `reference_downscale`), their controls'
# names and the Generate event's keywords for them (`serving.ui.events`), as `/generate_video` names them.
IN_CONTEXT = ("reference_strength", "reference_downscale")


@dataclass(frozen=True)
class VideoControls:
    """Frames and frames per second, and the clip's length they make."""

    row: gr.Row
    frames: gr.Slider
    fps: gr.Slider
    length: gr.Markdown
    # An IC-LoRA's reference video (`GenerateRequest.reference_video`), an upload shown where the pool takes one.
    reference: gr.Video
    # Its in-context settings (`IN_CONTEXT`'s order), empty: diffusers' defaults.
    settings: tuple[gr.Number, gr.Number]
    # The reference video and its settings, shown (where the pool takes a reference video) or hidden as one.
    in_context: gr.Column


def length_text(frames: float | None, fps: float | None) -> str:
    """ "81 frames: 5.1 s at 16 fps"."""
    if not frames or not fps:
        return ""
    return f"{int(frames)} frames: {frames / fps:.1f} s at {int(fps)} fps"


def _frames_control(defaults: ModelDefaults) -> dict[str, Any]:
    """The frames slider of `defaults`' pool: 4k+1 (its `frame_multiple`) up to its most."""
    step = defaults.frame_multiple or 4
    most = defaults.max_frames or defaults.num_frames or _FRAMES
    return {"minimum": step + 1, "maximum": most, "step": step, "value": defaults.num_frames or _FRAMES}


def video_controls(defaults: ModelDefaults) -> VideoControls:
    with gr.Row(visible=defaults.video, elem_id="video-controls") as row:
        frames = gr.Slider(label="Frames", elem_id="num-frames", **_frames_control(defaults))
        fps = gr.Slider(*FPS_RANGE, value=defaults.fps or _FPS, step=1, label="FPS", elem_id="fps")
    length = gr.Markdown(
        length_text(frames.value, fps.value) if defaults.video else "", visible=defaults.video, elem_id="video-length"
    )
    with gr.Column(visible=defaults.reference_video, elem_id="in-context") as in_context:
        reference = gr.Video(
            label="Reference video (IC-LoRA)",
            sources=["upload"],
            format=None,  # as uploaded: its header is checked before anything decodes it (`engine.video_input`)
            elem_id="reference-video",
        )
        with gr.Row():
            settings = (_setting(DECLARED_FIELDS[IN_CONTEXT[0]], 0.05), _setting(DECLARED_FIELDS[IN_CONTEXT[1]], 1))
    return VideoControls(row, frames, fps, length, reference, settings, in_context)


def _setting(declared: RequestField, step: float) -> gr.Number:
    """An in-context setting's box, labelled and explained by its declaration (`engine.requests`), empty: not
    sent, diffusers' default (a slider always holds a value, which the recipe would then name on every run). No
    bounds or precision of Gradio's own: a value out of range, or 2.5 for the factor, reaches the one check
    (`engine.video_references`), which refuses it by name as on every door, rather than Gradio clamping or
    rounding it quietly."""
    return gr.Number(
        None,
        label=declared.name.replace("_", " ").capitalize(),
        info=f"{declared.description}; {declared.accepts}; empty: diffusers' default",
        step=step,
        elem_id=declared.name.replace("_", "-"),
    )


def low_noise_control(slot: int, two_stage: bool) -> gr.Slider:
    """LoRA `slot`'s low-noise scale (`LoraSpec.scale_2`), shown on a two-stage pool (`ModelDefaults.two_stage`)."""
    return gr.Slider(
        -2,
        2,
        value=1.0,
        step=0.05,
        label="Low-noise scale",
        info=f"LoRA {slot} on the low-noise transformer; the scale above is the high-noise one's",
        visible=two_stage,
        elem_id=f"lora-{slot}-scale-2",
    )


def follow_scale(scale: float, moved: bool) -> Any:
    """The low-noise scale shown as the LoRA's `scale` changes: the same, until the user moved it (`moved`)."""
    return gr.skip() if moved else gr.Slider(value=scale)


def _moved_by_user() -> bool:
    return True


def low_noise_shown(handlers: Handlers, base: str) -> tuple[Any, Any]:
    """The low-noise scales shown for a two-stage pool's base, hidden for any other (kept for a base no pool
    serves)."""
    pool = pool_views.pool_for_base(handlers.pools, base) if base else None
    if pool is None:
        return gr.skip(), gr.skip()
    shown = pool.defaults.two_stage
    return gr.Slider(visible=shown), gr.Slider(visible=shown)


def on_base(handlers: Handlers, base: str, waiting: object = None) -> tuple[Any, ...]:
    """A new base: the video controls and result shown for a video pool (the image result hidden), with its
    frames and rate, or those a history entry or share link that chose this base left `waiting`
    (`serving.ui.history`); an image pool the other way round; the reference video's slot shown for a pool that
    takes one. Nothing changes for a base no pool serves."""
    pool = pool_views.pool_for_base(handlers.pools, base) if base else None
    if pool is None:
        return (gr.skip(),) * 7
    defaults = pool.defaults
    video = defaults.video
    frames = _frames_control(defaults)
    fps = defaults.fps or _FPS
    kept = waiting.get("video") if isinstance(waiting, dict) and waiting.get("base") == base else None
    if video and isinstance(kept, list) and len(kept) == 2:
        frames["value"] = kept[0] if isinstance(kept[0], int) else frames["value"]
        fps = kept[1] if isinstance(kept[1], int) else fps
    return (
        gr.Row(visible=video),
        gr.Slider(**frames),
        gr.Slider(value=fps),
        gr.Markdown(length_text(frames["value"], fps) if video else "", visible=video),
        gr.Video(visible=video),
        gr.Image(visible=not video),
        gr.Column(visible=defaults.reference_video),
    )


def wire_video(
    handlers: Handlers,
    base: gr.Dropdown,
    controls: VideoControls,
    outputs: tuple[gr.Video, gr.Image],
    pending: gr.State,
    slots: Sequence[tuple[gr.Slider, gr.Slider, gr.State]],
) -> None:
    """The base filter's switch (with the frames and rate `pending` keeps for it), the low-noise scales shown or
    hidden and following their LoRA's scale (`slots`: each LoRA's scale, low-noise scale and whether the user
    moved the latter), and the length line's updates (the UI's own events: no API)."""

    def switch(browsed: str, waiting: object) -> tuple[Any, ...]:
        return on_base(handlers, browsed, waiting)

    def switch_lows(browsed: str) -> tuple[Any, Any]:
        return low_noise_shown(handlers, browsed)

    options: dict[str, Any] = {"api_visibility": "private", "queue": False}
    shown = [controls.row, controls.frames, controls.fps, controls.length, *outputs, controls.in_context]
    base.change(switch, [base, pending], shown, **options)
    base.change(switch_lows, base, [low for _, low, _ in slots], **options)
    for scale, low, moved in slots:
        # `change` for the scale (a drag, a link's value: the link sets `moved` with it); `input` for the low-noise
        # scale, which only the user's own move fires (not this follow).
        scale.change(follow_scale, [scale, moved], low, **options)
        low.input(_moved_by_user, None, moved, **options)
    for slider in (controls.frames, controls.fps):
        slider.change(length_text, [controls.frames, controls.fps], controls.length, **options)


def video_request(
    handlers: Handlers,
    request: GenerateRequest,
    browsed: str,
    frames: float,
    fps: float,
    lows: Sequence[tuple[str | None, float | None]] = (),
    clip: object = None,
    settings: tuple[float | None, float | None] = (None, None),
) -> GenerateRequest:
    """`request` with the form's frames and rate when the browsed base's pool makes videos (an image pool's
    request is left as it is: it takes neither), with the LoRAs' low-noise scales (`lows`: each slot's
    reference and scale, as `low_noise` takes them) when that pool has two stages, and with the uploaded reference
    video (`clip`, its path) when that pool takes one: read as far as its header, as `/generate_video` reads it,
    and its in-context settings (`settings`, `IN_CONTEXT`'s order; None: diffusers' default) with it. A hidden
    slot's upload (left from a pool that took one) is not the request's."""
    pool = pool_views.pool_for_base(handlers.pools, browsed) if browsed else handlers.default
    if pool is None or not pool.defaults.video:
        return request
    if pool.defaults.two_stage and lows:
        request = low_noise(request, lows)
    reference = clip_of(handlers, clip) if pool.defaults.reference_video else None
    # The settings are the video's: without one they are not sent (the check would refuse them), so a user who
    # cleared the video after an IC-LoRA run gets the text-to-video run the form now shows, without having to
    # empty the boxes too.
    named: dict[str, Any] = dict(zip(IN_CONTEXT, settings, strict=True)) if reference is not None else {}
    return dataclasses.replace(request, num_frames=frames, fps=fps, reference_video=reference, **named)


def clip_of(handlers: Handlers, clip: object) -> EncodedVideo | None:
    """The reference video slot's upload (a path; None: none) read as far as its header (`read_video`)."""
    settings = handlers.settings
    return read_video(clip, "reference video", settings.max_input_pixels, settings.max_video_frames)


def low_noise(request: GenerateRequest, slots: Sequence[tuple[str | None, float | None]]) -> GenerateRequest:
    """`request` with each named LoRA's low-noise scale (`LoraSpec.scale_2`) from `slots`, (reference, scale_2)
    in the form's or the API's order; an empty slot has no LoRA in the request and is passed over."""
    lows = [low for ref, low in slots if (ref or "").strip()]
    loras = tuple(dataclasses.replace(spec, scale_2=low) for spec, low in zip(request.loras, lows, strict=True))
    return dataclasses.replace(request, loras=loras)


def preview(image: Any, request: GenerateRequest) -> Any:
    """A preview frame for the image result; on a video pool's run (the form gave it frames) the image, hidden
    there, shows again for the forming first frame until the video takes its place."""
    return gr.Image(image, visible=True) if request.num_frames is not None else image


def video_result(result: GenerateResult) -> Any:
    """The result's video for the `gr.Video` (its MP4 in Gradio's upload folder), or a skip for an image."""
    return gr.Video(saved_video(result), visible=True) if result.is_video else gr.skip()


def saved_video(result: GenerateResult) -> str:
    """The result's MP4 (`video_file`: the bytes `POST /` answers) in Gradio's upload folder, named by its hash
    (Gradio serves that folder and cleans it with its cache)."""
    return processing_utils.save_bytes_to_cache(video_file(result), "video.mp4", gradio_utils.get_upload_folder())
