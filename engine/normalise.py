"""Checking a request: `normalise_request` is the single gate every entry point goes through (via `Engine.check`).

It checks types and ranges, fills the served model's defaults and returns a new `CheckedRequest`; the caller's
object is never changed. The input images are counted and held to MAX_INPUT_PIXELS and MAX_REQUEST_PIXELS by their
headers before any is decoded (`engine.image_checks`), whichever door brought them, then decoded, and a canvas is
resized to the output's size here (on the checking thread, never under the GPU lock); an image a pool's pipeline
reads as a reference keeps its own size. The LoRAs'
recommendations are filled later, once they are prepared (`with_suggested`), without checking the request again.
Each refusal names the value and what is accepted.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import Literal, TypeVar

from PIL import Image

from engine.errors import InvalidRequestError, LimitExceededError
from engine.image_checks import checked_images
from engine.images import InputImage
from engine.references import check_reference_sizes, reference_notes
from engine.requests import (
    GUIDANCE_RANGE,
    LOCAL_PREFIX,
    MAX_SEED,
    MIN_SIDE,
    SCALE_RANGE,
    SUGGESTIBLE,
    CheckedRequest,
    GenerateRequest,
    Limits,
    LoraSpec,
    ModelDefaults,
    Suggested,
)
from engine.samplers import choose_scheduler, sampler_label
from engine.schedules import checked_spec
from engine.values import checked_int as _int
from engine.values import checked_number as _float
from engine.video_checks import check_tokens, check_video, video_mode_refusal
from engine.video_references import checked_reference
from lora_catalog import refs
from lora_catalog.civitai.refs import ACCEPTED as CIVITAI_ACCEPTED
from lora_catalog.civitai.refs import parse_civitai

__all__ = ["normalise_loras", "normalise_request", "parse_ref", "with_suggested"]

T = TypeVar("T")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def parse_ref(ref: object) -> tuple[Literal["hub", "local", "civitai"], str]:
    """Split a LoRA reference into its kind and name, refusing anything path- or URL-like but Civitai's forms
    (`lora_catalog.civitai.refs`), which become their canonical `civitai:<version>` / `civitai:models/<model>`."""
    civitai = parse_civitai(ref)
    if civitai is not None:
        return "civitai", civitai.canonical
    try:
        if isinstance(ref, str) and refs.is_local_ref(ref.strip()):
            return "local", refs.parse_local_ref(ref.strip()).as_posix()
        return "hub", refs.validate_repo_id(ref)  # type: ignore[arg-type]
    except InvalidRequestError as e:
        raise InvalidRequestError(
            f"{e}; or a local LoRA as 'local:<file>.safetensors'; or a Civitai LoRA: {CIVITAI_ACCEPTED}"
        ) from e


def normalise_request(
    request: GenerateRequest, defaults: ModelDefaults, limits: Limits, suggested: Suggested | None = None
) -> CheckedRequest:
    """Check every field and fill defaults (the LoRAs' `suggested` ones before the pool's: `with_suggested`);
    returns a new request with a concrete seed."""
    decoded, mask, images = checked_images(request, defaults, limits)  # counted and weighed, then decoded
    request = replace(request, image=decoded, mask_image=mask, images=images)
    video = check_video(request, defaults, limits)
    _check_mode(request, defaults)
    # An image request may come without a prompt (a raw image body: image-to-image with the defaults).
    prompt = _text("prompt", request.prompt, limits.max_prompt_chars, allow_empty=request.image is not None)
    negative = _text("negative_prompt", request.negative_prompt, limits.max_prompt_chars, allow_empty=True)
    loras = _loras(request.loras, limits.max_loras, limits.max_schedule_segments)
    loras = _second_scales(loras, defaults)
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
    # What the pipeline makes of each image it reads as a reference (not the image an inpainting repaints).
    fit, inpainting = defaults.reference_fit, request.mode == "inpainting"
    image = decoded if fit is not None and not inpainting else _fitted(decoded, (width, height))
    check_reference_sizes(image, images, fit, inpainting=inpainting)
    read = reference_notes(image, images, fit, inpainting=inpainting)
    checked = CheckedRequest(
        prompt=prompt,
        negative_prompt=negative,
        loras=loras,
        steps=steps,
        guidance=guidance,
        width=width,
        height=height,
        seed=seed,
        scheduler=scheduler,
        scheduler_options=options,
        clip_skip=clip_skip,
        num_images=num_images,
        num_frames=video.num_frames,
        fps=video.fps,
        guidance_2=video.guidance_2,
        expects=request.expects,
        lora_defaults=request.lora_defaults,
        image=image,
        mask_image=_fitted(mask, (width, height)),
        images=images,
        **checked_reference(request, defaults, limits, (width, height)),  # a reference video: gated, decoded
        strength=strength,
        sampler=sampler_label(scheduler, options) if scheduler is not None else defaults.sampler,
        left_unset=tuple(name for name in SUGGESTIBLE if getattr(request, name) is None),
        # A checked request checked again (a comparison's cells) keeps what its first check noted.
        notes=tuple(dict.fromkeys((*getattr(request, "notes", ()), *_mask_notes(request), *notes, *read))),
    )
    return checked if suggested is None else with_suggested(checked, suggested, defaults)


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


def normalise_loras(value: object, limit: int, segments: int = 64) -> tuple[LoraSpec, ...]:
    """A request's LoRAs checked and normalised as `normalise_request` does (the pools route on these; `segments`
    at MAX_SCHEDULE_SEGMENTS' ceiling there: the chosen pool's own check holds the setting)."""
    return _loras(value, limit, segments)


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


def _loras(value: object, limit: int, segments: int) -> tuple[LoraSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"loras must be a list of LoRA specs, got {type(value).__name__}")
    if len(value) > limit:
        raise LimitExceededError(f"{len(value)} LoRAs requested; accepted: at most {limit} per request")
    specs: list[LoraSpec] = []
    for spec in value:
        if not isinstance(spec, LoraSpec):
            raise InvalidRequestError(f"LoRA entry {spec!r} is not a LoraSpec")
        kind, name = parse_ref(spec.ref)
        # A Civitai reference names its version and file itself: a revision or file given with it is dropped, as
        # for a local file.
        ref = f"{LOCAL_PREFIX}{name}" if kind == "local" else name
        revision = _checked(refs.validate_revision, spec.revision) if kind == "hub" else None
        weight_name = _checked(refs.validate_weight_name, spec.weight_name) if kind == "hub" else None
        scale = _float(f"scale of {ref}", spec.scale, 1.0, *SCALE_RANGE)
        scale_2 = None if spec.scale_2 is None else _float(f"scale_2 of {ref}", spec.scale_2, 1.0, *SCALE_RANGE)
        spec = replace(spec, ref=ref, scale=scale, revision=revision, weight_name=weight_name, scale_2=scale_2)
        specs.append(checked_spec(spec, segments))
    identities = [(s.ref, s.revision, s.weight_name) for s in specs]
    if len(set(identities)) != len(identities):
        twice = next(i[0] for i in identities if identities.count(i) > 1)
        raise InvalidRequestError(f"LoRA {twice!r} is listed twice; accepted: each LoRA once, with one scale")
    return tuple(specs)


def _second_scales(loras: tuple[LoraSpec, ...], defaults: ModelDefaults) -> tuple[LoraSpec, ...]:
    """A low-noise scale (`scale_2`) applies on a two-transformer pool (`ModelDefaults.two_stage`: Wan 2.2 A14B's
    low-noise transformer; `scale` is the high-noise one's); elsewhere one other than `scale` is refused, as such
    a pool has no low-noise side. One equal to `scale` is dropped (None: the same scale), so both ask one set.
    So is a low-noise schedule (`schedule_2`) there: the schedule of a side the request does not run."""
    for spec in loras:
        if spec.scale_2 is not None and spec.scale_2 != spec.scale and not defaults.two_stage:
            raise InvalidRequestError(
                f"scale_2={spec.scale_2:g} of {spec.ref} was given, but this pool's model has one transformer; "
                "accepted: scale alone, or scale_2 equal to it"
            )
        if len(spec.schedule_2) > 1 and spec.schedule_2 != spec.schedule and not defaults.two_stage:
            raise InvalidRequestError(
                f"schedule_2 of {spec.ref} was given, but this pool's model has one transformer (no low-noise side "
                "to run it); accepted: schedule (or start/end) alone"
            )
    if not defaults.two_stage:
        return tuple(replace(s, scale_2=None, schedule_2=()) for s in loras)
    return tuple(replace(s, scale_2=None) if s.scale_2 == s.scale and not s.schedule_2 else s for s in loras)


def _checked(check: Callable[[str | None], str | None], value: object) -> str | None:
    return check(value or None)  # type: ignore[arg-type]


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
