"""The Gradio API's arguments as requests: `/generate`'s and `/generate_images`' as a `GenerateRequest`, and the
image, mask and strength every generation endpoint takes (`/compare` too) as the request's fields.

Values pass as given ("" and empty ones: not set); the engine checks each by name (`engine.normalise`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from engine.errors import InvalidRequestError
from engine.images import ImageMode, decode_image
from engine.requests import GenerateRequest, InputImage, LoraSpec
from engine.settings import Settings
from serving.ui import formatting as fmt

__all__ = ["api_request", "starting_fields"]

# The pixels an image file may hold, judged from its header before decoding (MAX_INPUT_PIXELS' default).
MAX_INPUT_PIXELS: int = Settings.model_fields["max_input_pixels"].default


def starting_fields(image: Any, mask: Any, strength: float | None, images: Any = None) -> dict[str, Any]:
    """An endpoint's `image`, `mask` (white repainted) and `strength` (gradio_client's `handle_file` uploads the
    files; Gradio hands them over as PIL images) as the request's `image`, `mask_image` and `strength`; `images`,
    the further references (a list of `handle_file`s, Gradio hands over their paths), as its `images`, each
    decoded by `engine.images.decode_image` (its size judged from its header first)."""
    return {
        "image": _input(image, "image", "RGB"),
        "mask_image": _input(mask, "mask", "L"),
        "strength": strength,
        "images": _references(images),
    }


def _references(value: Any) -> tuple[InputImage, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"images is a {type(value).__name__}; accepted: a list of image files (handle_file)")
    decoded = []
    for index, item in enumerate(value):
        path = item.get("path") if isinstance(item, dict) else item
        if isinstance(path, Image.Image):
            decoded.append(InputImage.from_pil(path, "RGB"))
            continue
        if not isinstance(path, str | Path):
            raise InvalidRequestError(
                f"images[{index}] is a {type(item).__name__}; accepted: an image file (handle_file)"
            )
        data = Path(path).read_bytes()
        decoded.append(decode_image(data, what=f"images[{index}]", max_pixels=MAX_INPUT_PIXELS))
    return tuple(decoded)


def _input(value: Any, name: str, mode: ImageMode) -> InputImage | None:
    if value is None:
        return None
    if not isinstance(value, Image.Image):
        raise InvalidRequestError(f"{name} is a {type(value).__name__}; accepted: an image file (handle_file) or none")
    return InputImage.from_pil(value, mode)


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
    starting: tuple[Any, Any, float | None, Any] = (None, None, None, None),
) -> GenerateRequest:
    """The API's arguments as a request ("" and empty values: not set); the engine checks every value."""
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
