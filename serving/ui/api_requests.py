"""The Gradio API's arguments as requests: `/generate`'s and `/generate_images`' as a `GenerateRequest`, and the
image, mask and strength every generation endpoint takes (`/compare` too) as the request's fields.

Values pass as given ("" and empty ones: not set); the engine checks each by name (`engine.normalise`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequestError
from engine.image_checks import check_door_count
from engine.images import ACCEPTED, EncodedImage, ImageMode, encoded_image
from engine.requests import REQUEST_FIELDS, GenerateRequest, LoraSpec
from engine.video_input import ACCEPTED_VIDEO, EncodedVideo, encoded_video
from serving.ui import formatting as fmt

__all__ = ["LATE", "api_request", "read_video", "starting_fields", "windowed"]

# The generation endpoints' last arguments (`RequestField.gradio_late`: each LoRA's window, then the second's).
LATE = tuple(name for f in REQUEST_FIELDS for name in f.gradio_late)


_UPLOADED = "an image file sent with gradio_client's handle_file, or none"


def starting_fields(
    image: Any, mask: Any, strength: float | None, images: Any, max_pixels: int, most_images: int | None = None
) -> dict[str, Any]:
    """An endpoint's `image`, `mask` (white repainted), `strength` and `images` (further references: a list of
    `handle_file`s) as the request's `image`, `mask_image`, `strength` and `images`. gradio_client's `handle_file`
    uploads the files (at most MAX_BODY_BYTES: `serving.ui.launch`); Gradio hands over their paths, and they are
    read as `POST /` reads its images: the references counted first (past `most_images`, MAX_REFERENCE_IMAGES, or
    past what any pool takes when None: refused before any file is opened), then each file read as far as its
    header (against `max_pixels`, MAX_INPUT_PIXELS); the engine's check decodes them once it has counted them."""
    return {
        "image": read_image(image, "image", "RGB", max_pixels),
        "mask_image": read_image(mask, "mask", "L", max_pixels),
        "strength": strength,
        "images": _references(images, max_pixels, most_images),
    }


def _references(value: Any, max_pixels: int, most_images: int | None) -> tuple[EncodedImage, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"images is a {type(value).__name__}; accepted: a list of image files (handle_file)")
    check_door_count(len(value), most_images)
    carried = []
    for index, item in enumerate(value):
        path = item.get("path") if isinstance(item, dict) else item
        image = read_image(path, f"images[{index}]", "RGB", max_pixels)
        if image is None:
            raise InvalidRequestError(f"images[{index}] is None; accepted: an image file (handle_file)")
        carried.append(image)
    return tuple(carried)


def read_image(value: Any, name: str, mode: ImageMode, max_pixels: int) -> EncodedImage | None:
    """The uploaded file at `value` (a path Gradio hands over; None: no image) as the request's image: its bytes
    and its header's size (`engine.images.encoded_image`), nothing decoded."""
    if value is None:
        return None
    if not isinstance(value, str | Path):
        raise InvalidRequestError(f"{name} is a {type(value).__name__}; accepted: {_UPLOADED}")
    try:
        data = Path(value).read_bytes()
    except OSError as e:
        raise InvalidRequestError(f"{name} could not be read ({e.strerror}); accepted: {ACCEPTED}") from e
    return encoded_image(data, what=name, max_pixels=max_pixels, mode=mode)


def read_video(value: Any, name: str, max_pixels: int, max_frames: int) -> EncodedVideo | None:
    """The uploaded MP4 at `value` (a path Gradio hands over; None: no video) as the request's reference video, read
    as far as its header (`engine.video_input.encoded_video`), nothing decoded."""
    if value is None:
        return None
    if not isinstance(value, str | Path):
        raise InvalidRequestError(f"{name} is a {type(value).__name__}; accepted: {ACCEPTED_VIDEO}, uploaded as a file")
    try:
        data = Path(value).read_bytes()
    except OSError as e:
        raise InvalidRequestError(f"{name} could not be read ({e.strerror}); accepted: {ACCEPTED_VIDEO}") from e
    return encoded_video(data, what=name, max_pixels=max_pixels, max_frames=max_frames)


def api_request(
    prompt: str,
    negative_prompt: str | None,
    loras: tuple[str, float | None, str, float | None],
    steps: float | None,
    guidance: float | None,
    width: float | None,
    height: float | None,
    seed: float | None,
    scheduler: str | None,
    scheduler_options: object,
    clip_skip: float | None,
    num_images: float | None,
    starting: tuple[Any, Any, float | None, Any, int, int | None],
) -> GenerateRequest:
    """The API's arguments as a request ("" and empty values: not set); the engine checks every value.
    `starting`: `starting_fields`' arguments."""
    lora, lora_scale, lora_2, lora_2_scale = loras
    specs = (_spec(lora, lora_scale, "lora_scale"), _spec(lora_2, lora_2_scale, "lora_2_scale"))
    if scheduler_options is not None and not isinstance(scheduler_options, dict):
        raise InvalidRequestError(
            f"scheduler_options={scheduler_options!r} is not accepted; accepted: an object such as "
            '{"use_karras_sigmas": true} (or null)'
        )
    return GenerateRequest(
        prompt=prompt,
        negative_prompt=negative_prompt or "",
        loras=tuple(s for s in specs if s),
        steps=steps,
        guidance=guidance,
        width=width,
        height=height,
        seed=fmt.seed_value(seed),
        scheduler=(scheduler or "").strip() or None,
        scheduler_options=tuple(sorted((scheduler_options or {}).items())),
        # 0 is no CLIP skip: sent as not set, so a LoRA's recommendation applies.
        clip_skip=clip_skip or None,
        num_images=num_images,
        **starting_fields(*starting),
    )


def _spec(lora: str | None, scale: float | None, name: str) -> LoraSpec | None:
    """The API's LoRA and scale; an explicit empty scale for a named LoRA is refused by name, not guessed."""
    if (lora or "").strip() and scale is None:
        raise InvalidRequestError(f"{name} is empty; accepted: a number from -2 to 2 (1 is the LoRA as trained)")
    return fmt.lora_spec(lora, scale)


# The generation endpoints' slots, in `windowed`'s order: the LoRA's field and its window's.
_SLOTS = (("lora", "lora_start", "lora_end"), ("lora_2", "lora_2_start", "lora_2_end"))


def windowed(request: GenerateRequest, slots: Sequence[tuple[str | None, object, object]]) -> GenerateRequest:
    """`request` with each named LoRA's schedule window (`LoraSpec.start`/`end`, fractions of the steps; None:
    0 and 1) from `slots`, (reference, start, end) in the API's or the form's order. An empty slot has no LoRA in
    the request: a window there (other than every step's) is a schedule on a LoRA the request does not use, refused
    by name rather than dropped (issue 51). Values pass as given: the engine checks them (`engine.schedules`)."""
    for (ref, start, end), names in zip(slots, _SLOTS, strict=True):
        if not (ref or "").strip():
            _check_unused(names, start, end)
    windows = [(start, end) for ref, start, end in slots if (ref or "").strip()]
    loras = tuple(
        dataclasses.replace(spec, start=start, end=end)  # type: ignore[arg-type]
        for spec, (start, end) in zip(request.loras, windows, strict=True)
    )
    return dataclasses.replace(request, loras=loras)


def _check_unused(names: tuple[str, str, str], start: object, end: object) -> None:
    """An empty slot's window: none, or every step's (0 to 1: what no window runs), else refused by name."""
    lora, *window = names
    for name, value, whole in zip(window, (start, end), (0, 1), strict=True):
        # `value != whole` too for NaN and any non-number: refused here, as a value for no LoRA.
        if value is not None and (isinstance(value, bool) or value != whole):
            raise InvalidRequestError(
                f"{name}={value!r} was given, but {lora} is empty: a schedule on a LoRA the request does not use; "
                f"accepted: {lora} set to a LoRA, or {name} left empty"
            )
