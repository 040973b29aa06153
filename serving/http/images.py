"""Hugging Face's image-to-image task on `POST /`: when the body's `inputs` is an image, and what it becomes.

`inputs` is the image (base64, with or without a `data:image/...;base64,` prefix) when it carries such a
prefix, when its bytes start as a PNG, JPEG or WebP file does, or when `parameters` hold one of the task's own
(`prompt`, `target_size`, `mask_image`, `strength`); otherwise it is the text-to-image prompt, as before. Then
`parameters.prompt` is the prompt ("" without one), `target_size` the output's width and height (the image resized
to it first), and `mask_image` (base64 too) turns the request into inpainting. `images` (a list of base64
images) are further references after `inputs` (the prompt's "image 2", ...); only a JSON body carries them.

Count, then decode: the references are counted first (more than MAX_REFERENCE_IMAGES, or than any pool takes, is
refused before a single one is read: `engine.image_checks.check_door_count`); then each image's file is read as
far as its header (`engine.images.encoded_image`: the format whitelisted, the size against MAX_INPUT_PIXELS) and
carried into the request as sent; the engine's check counts them against the pool, weighs them, then decodes.
`parameters.video` (an IC-LoRA's reference MP4, base64 or a data URL) is read the same way, as far as its header
(`engine.video_input.encoded_video`).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import InvalidRequestError
from engine.image_checks import check_door_count
from engine.images import ACCEPTED, EncodedImage, ImageMode, encoded_image
from engine.requests import GenerateRequest
from engine.video_input import ACCEPTED_VIDEO, encoded_video

__all__ = ["IMAGE_ONLY", "TargetSize", "image_request", "is_image_text", "video_request"]

# Parameters of the image-to-image task that fill no request field of their own name.
IMAGE_ONLY = ("prompt", "target_size", "mask_image")
# Parameters that make `inputs` an image.
_IMAGE_PARAMETERS = (*IMAGE_ONLY, "strength")
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?(;[\w=.+-]+){0,8};base64,", re.IGNORECASE)
# A data URL's prefix is read within this many characters, never over the whole text: `inputs` may be 32 MB, and a
# pattern with repeated parameters run over all of it backtracks for seconds with the GIL held.
_PREFIX_CHARS = 256
# How each accepted format's file starts (WebP: RIFF, 4 bytes of size, WEBP).
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF")


class TargetSize(BaseModel):
    """an object {"width": <integer>, "height": <integer>}: the output's size, the image resized to it first"""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    width: int = Field(description="an integer")
    height: int = Field(description="an integer")


def is_image_text(text: str) -> bool:
    """Whether `text` is a base64 image: a data URL, or base64 whose bytes start as an accepted file does."""
    if _data_url(text):
        return True
    try:
        head = base64.b64decode(text[:32], validate=True)
    except (binascii.Error, ValueError):
        return False
    return head.startswith(_MAGIC)


def image_request(
    request: GenerateRequest, parameters: Any, max_pixels: int, most_images: int | None = None
) -> GenerateRequest:
    """`request` (its prompt is the body's `inputs`) as image-to-image when `inputs` is an image (see the module
    docstring), else as it is. `most_images`: MAX_REFERENCE_IMAGES (None: `auto`)."""
    asked = [name for name in _IMAGE_PARAMETERS if getattr(parameters, name, None) is not None]
    # `parameters.images`: the further references, counted, then each read as `inputs` is; without an image in
    # `inputs` the engine refuses them, naming the first image they need.
    texts = getattr(parameters, "images", None) or ()
    check_door_count(len(texts), most_images)
    references = tuple(
        _encoded(text, f"parameters.images[{index}]", max_pixels, "RGB") for index, text in enumerate(texts)
    )
    request = replace(request, images=references)
    if not asked and not is_image_text(request.prompt):
        return request
    image = _encoded(request.prompt, "inputs", max_pixels, "RGB")
    mask = parameters.mask_image
    size = parameters.target_size
    if size is not None and (request.width is not None or request.height is not None):
        raise InvalidRequestError(
            "target_size was given with width or height; accepted: target_size, or width and height, not both"
        )
    return replace(
        request,
        prompt=parameters.prompt or "",
        image=image,
        mask_image=None if mask is None else _encoded(mask, "parameters.mask_image", max_pixels, "L"),
        width=request.width if size is None else size.width,
        height=request.height if size is None else size.height,
    )


def video_request(request: GenerateRequest, parameters: Any, max_pixels: int, max_frames: int) -> GenerateRequest:
    """`request` with `parameters.video` (an IC-LoRA's reference MP4, base64 or a data URL) read as far as its
    header (`engine.video_input.encoded_video`: MAX_INPUT_PIXELS a frame, MAX_VIDEO_FRAMES); as it is without one."""
    text = getattr(parameters, "video", None)
    if text is None:
        return request
    data = _base64(text, "parameters.video", ACCEPTED_VIDEO)
    video = encoded_video(data, what="parameters.video", max_pixels=max_pixels, max_frames=max_frames)
    return replace(request, reference_video=video)


def _encoded(text: str, what: str, max_pixels: int, mode: ImageMode) -> EncodedImage:
    """The base64 image `text` (a data URL's prefix dropped), read as far as its header; refusals name `what`."""
    data = _base64(text, what, f"{ACCEPTED} in base64, with or without a data:image/...;base64, prefix")
    return encoded_image(data, what=what, max_pixels=max_pixels, mode=mode)


def _base64(text: str, what: str, accepted: str) -> bytes:
    """The bytes of the base64 `text` (a data URL's prefix dropped); a refusal names `what` and `accepted`."""
    prefix = _data_url(text)
    payload = text[prefix.end() :] if prefix else text
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        shown = text[:40] + ("..." if len(text) > 40 else "")
        raise InvalidRequestError(f"{what} is not base64 ({shown!r}: {e}); accepted: {accepted}") from e


def _data_url(text: str) -> re.Match[str] | None:
    """The `data:...;base64,` prefix of `text`, looked for in its first `_PREFIX_CHARS` characters only."""
    return _DATA_URL.match(text, 0, _PREFIX_CHARS)
