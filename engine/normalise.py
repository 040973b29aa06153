"""Checking a request: `normalise_request` is the single gate every entry point goes through (via `Engine.check`).

It checks types and ranges, fills the served model's defaults and returns a new `CheckedRequest`; the caller's
object is never changed. The input images are counted and held to MAX_INPUT_PIXELS and MAX_REQUEST_PIXELS by their
headers before any is decoded (`engine.image_checks`), whichever door brought them, then decoded, and a canvas is
resized to the output's size here (on the checking thread, never under the GPU lock); an image a pool's pipeline
reads as a reference keeps its own size. The LoRA list is checked by `engine.lora_checks`; the LoRAs'
recommendations are filled later, once they are prepared (`with_suggested`), without checking the request again.
Each refusal names the value and what is accepted.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import replace
from typing import TypedDict, TypeVar

from PIL import Image

from engine.errors import InvalidRequestError, LimitExceededError
from engine.image_checks import CheckedImages, checked_images
from engine.images import InputImage
from engine.lora_checks import checked_loras, normalise_loras, parse_ref, second_scales
from engine.references import check_reference_sizes, reference_notes
from engine.requests import (
    GUIDANCE_RANGE,
    MAX_SEED,
    MIN_SIDE,
    SUGGESTIBLE,
    CheckedRequest,
    GenerateRequest,
    Limits,
    ModelDefaults,
    Suggested,
)
from engine.samplers import SchedulerOptions, choose_scheduler, sampler_label
from engine.values import checked_int as _int
from engine.values import checked_number as _float
from engine.video_checks import VideoSettings, check_tokens, check_video, video_mode_refusal
from engine.video_references import checked_reference

# `normalise_loras` and `parse_ref` are `engine.lora_checks`' (imported from here too).
__all__ = ["normalise_loras", "normalise_request", "parse_ref", "with_suggested"]

T = TypeVar("T")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class _Run(TypedDict):
    """The run's numbers, checked and filled with the pool's defaults (`CheckedRequest`'s fields)."""

    steps: int
    guidance: float
    width: int
    height: int
    strength: float | None
    seed: int
    scheduler: str | None
    scheduler_options: SchedulerOptions
    clip_skip: int
    num_images: int
    num_frames: int
    fps: int
    guidance_2: float | None


class _Pictures(TypedDict):
    """The images as the run takes them (`CheckedRequest`'s fields)."""

    image: InputImage | None
    mask_image: InputImage | None
    images: tuple[InputImage, ...]


def normalise_request(
    request: GenerateRequest, defaults: ModelDefaults, limits: Limits, suggested: Suggested | None = None
) -> CheckedRequest:
    """Check every field and fill defaults (the LoRAs' `suggested` ones before the pool's: `with_suggested`);
    returns a new request with a concrete seed.

    The steps run in this order, which is the order of refusals (a request wrong twice is refused for the first
    thing it gets wrong): its inputs (`_inputs`: the images counted and weighed by their headers, then decoded;
    the video fields; the mode the pool serves), its prompts, its LoRAs, the run's numbers (`_run`), the images
    as the run takes them (`_pictures`: the references' sizes), then the reference video (`checked_reference`:
    its settings, its header, then decoded). Only then do the LoRAs' suggestions fill what was left unset."""
    request, (decoded, mask, images), video = _inputs(request, defaults, limits)
    # An image request may come without a prompt (a raw image body: image-to-image with the defaults).
    prompt = _text("prompt", request.prompt, limits.max_prompt_chars, allow_empty=request.image is not None)
    negative = _text("negative_prompt", request.negative_prompt, limits.max_prompt_chars, allow_empty=True)
    loras = second_scales(checked_loras(request.loras, limits.max_loras, limits.max_schedule_segments), defaults)
    run, noted = _run(request, defaults, limits, video)
    size, scheduler, options = (run["width"], run["height"]), run["scheduler"], run["scheduler_options"]
    pictures, read = _pictures(request, defaults, (decoded, mask, images), size)
    checked = CheckedRequest(
        prompt=prompt,
        negative_prompt=negative,
        loras=loras,
        expects=request.expects,
        lora_defaults=request.lora_defaults,
        **run,
        **pictures,
        **checked_reference(request, defaults, limits, size),  # a reference video: gated, decoded
        sampler=sampler_label(scheduler, options) if scheduler is not None else defaults.sampler,
        left_unset=tuple(name for name in SUGGESTIBLE if getattr(request, name) is None),
        # A checked request checked again (a comparison's cells) keeps what its first check noted.
        notes=tuple(dict.fromkeys((*getattr(request, "notes", ()), *_mask_notes(request), *noted, *read))),
    )
    return checked if suggested is None else with_suggested(checked, suggested, defaults)


def _inputs(
    request: GenerateRequest, defaults: ModelDefaults, limits: Limits
) -> tuple[GenerateRequest, CheckedImages, VideoSettings]:
    """The request with its images decoded (counted and weighed by their headers first: `checked_images`), those
    images, and its checked video fields (`check_video`); then the pool must serve its mode (`_check_mode`)."""
    decoded, mask, images = checked_images(request, defaults, limits)
    request = replace(request, image=decoded, mask_image=mask, images=images)
    video = check_video(request, defaults, limits)
    _check_mode(request, defaults)
    return request, (decoded, mask, images), video


def _run(
    request: GenerateRequest, defaults: ModelDefaults, limits: Limits, video: VideoSettings
) -> tuple[_Run, tuple[str, ...]]:
    """The run's numbers, in this order: steps, guidance, the output's size (and a video's tokens at it), the
    strength (which needs the steps), seed, sampler, CLIP skip, the LoRA-defaults switch, the image count; and
    what the check noted (a strength the pool does not take)."""
    steps = _int("steps", request.steps, defaults.steps, 1, limits.max_steps)
    guidance = _float("guidance", request.guidance, defaults.guidance, *GUIDANCE_RANGE)
    width, height = _size(request, defaults)
    check_tokens(video.num_frames, width, height, defaults)
    strength, notes = _strength(request, defaults, steps)
    seed = _int("seed", request.seed, secrets.randbelow(MAX_SEED + 1), 0, MAX_SEED)
    scheduler, options = choose_scheduler(
        request.scheduler, request.scheduler_options, defaults.scheduler, defaults.schedulers
    )
    clip_skip = _clip_skip(request.clip_skip, 0, defaults)
    _check_switch(request.lora_defaults)
    num_images = _int("num_images", request.num_images, 1, 1, limits.max_images)
    run = _Run(
        steps=steps,
        guidance=guidance,
        width=width,
        height=height,
        strength=strength,
        seed=seed,
        scheduler=scheduler,
        scheduler_options=options,
        clip_skip=clip_skip,
        num_images=num_images,
        num_frames=video.num_frames,
        fps=video.fps,
        guidance_2=video.guidance_2,
    )
    return run, notes


def _pictures(
    request: GenerateRequest, defaults: ModelDefaults, decoded: CheckedImages, size: tuple[int, int]
) -> tuple[_Pictures, tuple[str, ...]]:
    """The decoded images as the run takes them (`_fitted`: a canvas and its mask at the output's `size`, an
    image the pipeline reads as a reference at its own), the references' sizes checked, and what the pipeline
    makes of each (`reference_notes`)."""
    first, mask, images = decoded
    # What the pipeline makes of each image it reads as a reference (not the image an inpainting repaints).
    fit, inpainting = defaults.reference_fit, request.mode == "inpainting"
    image = first if fit is not None and not inpainting else _fitted(first, size)
    check_reference_sizes(image, images, fit, inpainting=inpainting)
    read = reference_notes(image, images, fit, inpainting=inpainting)
    return _Pictures(image=image, mask_image=_fitted(mask, size), images=images), read


def _check_switch(value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidRequestError(f"lora_defaults={value!r} is not accepted; accepted: true, false")


def with_suggested(checked: CheckedRequest, suggested: Suggested, defaults: ModelDefaults) -> CheckedRequest:
    """`checked` with the LoRAs' `suggested` defaults where its client set nothing (`left_unset`), and where each
    came from; nothing else is checked again. A suggested sampler takes the client's options (`choose_scheduler`
    checks they fit it)."""
    unset = set(checked.left_unset)

    def pick(name: str, value: T, suggestion: T | None) -> T:
        return suggestion if name in unset and suggestion is not None else value

    scheduler, options = checked.scheduler, checked.scheduler_options
    named = pick("scheduler", None, suggested.scheduler)
    if named is not None:
        scheduler, options = choose_scheduler(named, options, defaults.scheduler, defaults.schedulers)
    clip_skip = checked.clip_skip
    if "clip_skip" in unset and suggested.clip_skip is not None and defaults.max_clip_skip:
        clip_skip = min(suggested.clip_skip, defaults.max_clip_skip)
    return replace(
        checked,
        steps=pick("steps", checked.steps, suggested.steps),
        guidance=pick("guidance", checked.guidance, suggested.guidance),
        guidance_2=pick("guidance_2", checked.guidance_2, suggested.guidance_2),
        scheduler=scheduler,
        scheduler_options=options,
        clip_skip=clip_skip,
        sampler=sampler_label(scheduler, options) if scheduler is not None else defaults.sampler,
        defaults_from=tuple((f, source) for f, source in suggested.sources if f in unset or f not in SUGGESTIBLE),
    )


def _clip_skip(value: object, default: int, defaults: ModelDefaults) -> int:
    if defaults.max_clip_skip == 0:
        if value not in (None, 0):
            raise InvalidRequestError(
                f"clip_skip={value!r} is not accepted: this pool's model takes no CLIP skip (its pipeline has no "
                "clip_skip input); accepted: 0 or none"
            )
        return 0
    return _int("clip_skip", value, min(default, defaults.max_clip_skip), 0, defaults.max_clip_skip)


def _text(name: str, value: object, limit: int, *, allow_empty: bool) -> str:
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{name} must be text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(f"{name} is not valid UTF-8 text (bad character at position {e.start})") from e
    if bad := _CONTROL.search(value):
        raise InvalidRequestError(
            f"{name} holds a control character U+{ord(bad.group()):04X} at position {bad.start()}; "
            "accepted: printable text, spaces, tabs and newlines"
        )
    text = " ".join(value.split())
    if not text and not allow_empty:
        raise InvalidRequestError(f"{name} is empty; accepted: 1 to {limit} characters of text")
    if len(text) > limit:
        raise LimitExceededError(f"{name} has {len(text)} characters; accepted: at most {limit}")
    return text


def _check_mode(request: GenerateRequest, defaults: ModelDefaults) -> None:
    """The pool serves the request's mode (an editing pool: only with an image)."""
    if request.mode in defaults.modes:
        return
    if (refusal := video_mode_refusal(request, defaults)) is not None:
        raise refusal
    served = ", ".join(defaults.modes)
    if defaults.needs_image and request.image is None:
        raise InvalidRequestError(
            f"this pool's model edits an image: a {request.mode} request needs one; accepted: an image with the "
            f"instruction as the prompt ({served})"
        )
    raise InvalidRequestError(f"this pool's model has no {request.mode} pipeline; accepted: {served}")


def _size(request: GenerateRequest, defaults: ModelDefaults) -> tuple[int, int]:
    """The output's size: as asked (for an image, its target size), else the image's size rounded to the side
    multiple, else the pool's default side."""
    image = request.image
    if image is None or request.width is not None or request.height is not None:
        return _side("width", request.width, defaults), _side("height", request.height, defaults)
    step = defaults.side_multiple
    width, height = (max(MIN_SIDE, step * round(side / step)) for side in image.size)
    if max(width, height) > defaults.max_side:
        raise LimitExceededError(
            f"the image is {image.width}x{image.height}, over this pool's largest side {defaults.max_side}; "
            f"accepted: an image of sides {MIN_SIDE} to {defaults.max_side}, or a target_size (width and height) "
            "it is resized to"
        )
    return width, height


def _strength(request: GenerateRequest, defaults: ModelDefaults, steps: int) -> tuple[float | None, tuple[str, ...]]:
    """The strength an image run uses (None: text-to-image, or a pool whose pipeline takes none: a strength sent
    there is checked, then dropped with a note). diffusers runs about `steps * strength` steps: fewer than one is
    refused here, not failed in the run."""
    if request.image is None:
        if request.strength is not None:
            raise InvalidRequestError(
                f"strength={request.strength!r} was given without an image; accepted: a strength with an image"
            )
        return None, ()
    default = defaults.inpaint_strength if request.mode == "inpainting" else defaults.strength
    if default is None:
        if request.strength is None:
            return None, ()
        ignored = _float("strength", request.strength, 0.0, 0.0, 1.0)
        why = "the image is the video's first frame" if defaults.video else "it edits the whole image"
        return None, (f"strength does not apply to this model ({why}); {ignored:g} ignored",)
    strength = _float("strength", request.strength, default, 0.0, 1.0)
    if steps * strength < 1:
        raise InvalidRequestError(
            f"strength={strength:g} with {steps} steps runs no denoising step; accepted: a strength from "
            f"{1 / steps:g} to 1 at {steps} steps (or more steps)"
        )
    return strength, ()


def _mask_notes(request: GenerateRequest) -> tuple[str, ...]:
    """A mask of another size than its image is resized to it (said so), as diffusers would."""
    image, mask = request.image, request.mask_image
    if image is None or mask is None or mask.size == image.size:
        return ()
    return (
        f"mask_image is {mask.width}x{mask.height}, the image {image.width}x{image.height}: the mask was resized "
        "to the image's size",
    )


def _fitted(image: InputImage | None, size: tuple[int, int]) -> InputImage | None:
    """A canvas (image-to-image's, inpainting's image and mask) at the output's `size` (Lanczos, as diffusers'
    own `resize_mode="default"` resamples): the run takes it as it is, so no resize waits under the GPU lock. Not
    an image the pool's pipeline reads as a reference (a `reference_fit`: FLUX.2's, Qwen-Image-Edit-2509/2511's
    image 1): that goes at its own size and aspect, as diffusers' call takes it, and sizes it itself."""
    if image is None or image.size == size:
        return image
    return InputImage.from_pil(image.to_pil().resize(size, Image.Resampling.LANCZOS), image.mode)


def _side(name: str, value: object, defaults: ModelDefaults) -> int:
    side = _int(name, value, defaults.side, MIN_SIDE, defaults.max_side)
    step = defaults.side_multiple
    if side % step:
        raise InvalidRequestError(
            f"{name}={side} is not a multiple of {step}; accepted: {MIN_SIDE} to {defaults.max_side} in {step}s"
        )
    return side
