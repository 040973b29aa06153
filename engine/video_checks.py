"""A request's video fields checked for `engine.normalise.normalise_request` (the one gate), refusals naming the
value and what is accepted.

Policy: on an image pool the video fields (`num_frames`, `fps`, `guidance_2`) are refused (a client asking an
image model for frames expects a video, and would otherwise get one still image without noticing); on a video
pool `num_frames` is `frame_multiple`k+1 (Wan's VAE packs the first frame alone and 4 frames in each latent frame
after it) up to the pool's `max_frames` and MAX_VIDEO_FRAMES, `fps` within FPS_RANGE, the clip (frames / fps)
within the pool's model's longest (`max_seconds`: LTX-2's 20 s, where its sound lasts the clip), and `guidance_2`
within the guidance range (ignored, with a warning, on a pool of one stage: `ModelDefaults.ignored`). A video pool
makes one video a request and takes no mask. An image-to-video-only pool refuses a request without an image, a
text-to-video-only pool one with an image (`video_mode_refusal`). A door that answers one kind (`expects`: the
image endpoints "image", /generate_video "video") refuses a pool of the other before anything runs
(`kind_refusal`); POST / and the UI answer what the pool makes.

A video pool's memory plan is made for a size (`ModelDefaults.video_plan`: its base's card's frames, width and
height, `engine.families.wan_memory`): a video of more transformer tokens than that size's is refused
(`check_tokens`), naming the most frames at the asked size and the largest size (of the asked aspect) at the asked
frames. Tokens are `latent_tokens`: the plan's formula, in the pool's own frame rule and side multiple.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.errors import InvalidRequestError, LimitExceededError
from engine.requests import (
    FPS_RANGE,
    GUIDANCE_RANGE,
    MIN_SIDE,
    CheckedRequest,
    GenerateRequest,
    Limits,
    ModelDefaults,
)
from engine.values import checked_int, checked_number

__all__ = [
    "VIDEO_FIELDS",
    "VideoSettings",
    "check_tokens",
    "check_video",
    "kind_refusal",
    "latent_tokens",
    "video_mode_refusal",
]

VIDEO_FIELDS = ("num_frames", "fps", "guidance_2")


@dataclass(frozen=True)
class VideoSettings:
    """A checked request's video fields: 0, 0 and None on an image pool."""

    num_frames: int = 0
    fps: int = 0
    guidance_2: float | None = None


def check_video(request: GenerateRequest, defaults: ModelDefaults, limits: Limits) -> VideoSettings:
    """The request's video fields checked against the pool (see the module docstring)."""
    if (refusal := kind_refusal(request, defaults)) is not None:
        raise refusal
    if not defaults.video:
        # A request checked before (a comparison's cells) holds an image's 0 frames: nothing was given.
        for name in () if isinstance(request, CheckedRequest) else VIDEO_FIELDS:
            value = getattr(request, name)
            if value is not None:
                raise InvalidRequestError(
                    f"{name}={value!r} was given, but this pool's model makes images, not videos; accepted: "
                    f"{', '.join(VIDEO_FIELDS)} on a video pool only (leave them out here)"
                )
        return VideoSettings()
    if request.num_images not in (None, 1):
        raise InvalidRequestError(
            f"num_images={request.num_images!r} is not accepted on a video pool; accepted: 1 (one video a request)"
        )
    if request.mask_image is not None:
        raise InvalidRequestError("mask_image was given to a video pool; accepted: no mask (video is not inpainted)")
    fps = checked_int("fps", request.fps, defaults.fps, *FPS_RANGE)
    guidance_2 = None
    if defaults.guidance_2 is not None or request.guidance_2 is not None:
        fallback = defaults.guidance_2 if defaults.guidance_2 is not None else 0.0
        guidance_2 = checked_number("guidance_2", request.guidance_2, fallback, *GUIDANCE_RANGE)
    frames = _frames(request.num_frames, defaults, limits)
    _check_seconds(frames, fps, defaults)
    return VideoSettings(frames, fps, guidance_2)


def _check_seconds(frames: int, fps: int, defaults: ModelDefaults) -> None:
    """A clip no longer than the pool's model makes (`ModelDefaults.max_seconds`; LTX-2's 20 s), named with the
    most frames at this rate."""
    if not defaults.max_seconds or frames <= defaults.max_seconds * fps:
        return
    most = _rounded_down(int(defaults.max_seconds * fps), defaults.frame_multiple)
    raise LimitExceededError(
        f"num_frames={frames} at fps={fps} is {frames / fps:.3g} s, longer than the {defaults.max_seconds:g} s this "
        f"pool's model makes; accepted: at {fps} fps at most {most} frames, or a higher fps"
    )


def _frames(value: object, defaults: ModelDefaults, limits: Limits) -> int:
    """`num_frames` of the form `frame_multiple`k+1 within the pool's and the Space's maximum; None: the pool's
    default (the largest allowed when the Space allows fewer)."""
    step = defaults.frame_multiple
    pool = _rounded_down(defaults.max_frames or limits.max_video_frames, step)
    space = _rounded_down(limits.max_video_frames, step)
    high = min(pool, space)
    rule = f"{step}k+1 frames from 1 to {high} ({', '.join(str(step * k + 1) for k in range(1, 4))}, ..., {high})"
    frames = checked_int("num_frames", value, _rounded_down(min(defaults.num_frames, high), step), 1, 2**31)
    if (frames - 1) % step:
        near = _rounded_down(frames, step)
        raise InvalidRequestError(
            f"num_frames={frames} is not of the form {step}k+1 (the video VAE makes {step} frames of each latent "
            f"frame after the first); accepted: {rule}, e.g. {near} or {near + step}"
        )
    if frames > high:
        # A pool loaded under MAX_VIDEO_FRAMES has it as its most already (`VideoDefaults.capped`).
        whose = "this pool's model" if pool < space else "this Space's MAX_VIDEO_FRAMES"
        raise LimitExceededError(f"num_frames={frames} is over what {whose} allows; accepted: {rule}")
    return frames


def _rounded_down(frames: int, step: int) -> int:
    """The largest `step`k+1 at most `frames` (at least 1)."""
    return max(1, (frames - 1) // step * step + 1)


def video_mode_refusal(request: GenerateRequest, defaults: ModelDefaults) -> InvalidRequestError | None:
    """Why a video pool cannot serve the request's mode (None: it can, or this is an image pool): an
    image-to-video-only pool needs an image; a text-to-video-only pool takes none."""
    if not defaults.video or request.mode in defaults.modes:
        return None
    if request.image is None:
        return InvalidRequestError(
            "this pool's model makes a video from an image (image-to-video): a request needs an image; accepted: "
            "an image (the first frame) with the prompt"
        )
    named = f" ({defaults.base_model})" if defaults.base_model else ""
    return InvalidRequestError(
        f"an image was given, but this pool's model{named} is text-to-video only; accepted: a prompt without an "
        "image (image-to-video needs an image-to-video pool)"
    )


def kind_refusal(request: GenerateRequest, defaults: ModelDefaults) -> InvalidRequestError | None:
    """Why the door's kind (`GenerateRequest.expects`) is not what the pool makes (None: it is, or the door answers
    either)."""
    expects = request.expects
    if expects is None:
        return None
    if expects not in ("image", "video"):
        return InvalidRequestError(f"expects={expects!r} is not accepted; accepted: 'image', 'video' or none")
    makes = "video" if defaults.video else "image"
    if expects == makes:
        return None
    named = f" ({defaults.base_model})" if defaults.base_model else ""
    if makes == "video":
        return InvalidRequestError(
            f"this endpoint answers images, but this pool's model{named} makes videos; accepted: /generate_video "
            "or POST / on a video pool, or a LoRA or base of an image pool here"
        )
    return InvalidRequestError(
        f"this endpoint answers videos, but this pool's model{named} makes images; accepted: a LoRA or base of a "
        "video pool here, or /generate, /generate_images or POST / for images"
    )


def latent_tokens(frames: int, width: int, height: int, frame_multiple: int, cell: int) -> int:
    """The video transformer's tokens: (frames - 1) / `frame_multiple` + 1 latent frames, each of (height / cell)
    x (width / cell) patches (`cell`: the VAE's spatial scale times the 2x2 patch, a pool's side multiple)."""
    return ((frames - 1) // frame_multiple + 1) * (height // cell) * (width // cell)


def check_tokens(frames: int, width: int, height: int, defaults: ModelDefaults) -> None:
    """A video within the tokens of the pool's plan (`ModelDefaults.video_plan`; see the module docstring)."""
    if not defaults.video or not defaults.video_plan:
        return
    step, cell = defaults.frame_multiple, defaults.side_multiple
    planned_frames, planned_width, planned_height = defaults.video_plan
    budget = latent_tokens(planned_frames, planned_width, planned_height, step, cell)
    asked = latent_tokens(frames, width, height, step, cell)
    if asked <= budget:
        return
    # The most latent frames at this size, and the most patches a latent frame at these frames.
    latent, patches = budget // ((width // cell) * (height // cell)), budget // ((frames - 1) // step + 1)
    most = f"at most {step * (latent - 1) + 1} frames" if latent else "no frame count"
    wide, high = width // cell, height // cell
    largest = (cell * math.isqrt(wide * patches // high), cell * math.isqrt(high * patches // wide))
    fits = min(largest) >= MIN_SIDE
    size = f"at most {largest[0]}x{largest[1]}" if fits else "no size of this aspect"
    raise LimitExceededError(
        f"num_frames={frames} at {width}x{height} is {asked} video tokens, more than the {budget} this pool's "
        f"memory plan is made for ({planned_frames} frames at {planned_width}x{planned_height}); accepted: at "
        f"{width}x{height} {most}, or at {frames} frames {size} (any frames and size of at most {budget} tokens)"
    )
