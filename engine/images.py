"""The images a request brings (`GenerateRequest.image`, `.mask_image`): `InputImage`, and decoding a file's bytes
into one.

An `InputImage` is the pixels themselves, 8-bit RGB (a mask: 8-bit grayscale, `L`), with their size: frozen,
hashable and compared by value, as the frozen request needs (a request equals its copy, whichever transport
carried it). `to_pil()` makes a new PIL image each time, so no run can change another's input.

`decode_image` is the one way bytes become an image: only the formats in `ACCEPTED_FORMATS`; the size is read
from the file's header and checked against the limit **before** the pixels are decoded (a decompression bomb
is refused by its header, never decoded); an EXIF orientation is applied, as a viewer shows the photo. Every
refusal is an InvalidRequestError naming the value and what is accepted.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from typing import Literal

from PIL import Image, ImageOps, UnidentifiedImageError

from engine.errors import InvalidRequestError, LimitExceededError

__all__ = ["ACCEPTED_FORMATS", "ACCEPTED_MEDIA_TYPES", "ImageMode", "InputImage", "decode_image"]

# PIL's format names -> the media types a client sends them as.
ACCEPTED_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
ACCEPTED_MEDIA_TYPES = tuple(ACCEPTED_FORMATS.values())
ACCEPTED = "a PNG, JPEG or WebP image"
# RGB for an input image; L (grayscale, white repainted) for an inpainting mask.
ImageMode = Literal["RGB", "L"]


@dataclass(frozen=True)
class InputImage:
    """An image of a request: `width` x `height` pixels in `mode`, row-major bytes (`PIL.Image.tobytes()`)."""

    width: int
    height: int
    mode: ImageMode
    data: bytes = field(repr=False)

    def __post_init__(self) -> None:
        channels = 3 if self.mode == "RGB" else 1
        if self.width < 1 or self.height < 1 or len(self.data) != self.width * self.height * channels:
            raise ValueError(f"{len(self.data)} bytes are not a {self.width}x{self.height} {self.mode} image")

    @classmethod
    def from_pil(cls, image: Image.Image, mode: ImageMode = "RGB") -> InputImage:
        """`image` in `mode` (a transparent pixel becomes its colour's channels: PIL's `convert`)."""
        converted = image.convert(mode)
        return cls(converted.width, converted.height, mode, converted.tobytes())

    def to_pil(self) -> Image.Image:
        """A new PIL image of these pixels."""
        return Image.frombytes(self.mode, (self.width, self.height), self.data)

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height

    @property
    def pixels(self) -> int:
        return self.width * self.height


def decode_image(data: bytes, *, what: str, max_pixels: int, mode: ImageMode = "RGB") -> InputImage:
    """`data` (a PNG, JPEG or WebP file) as an `InputImage` in `mode`; `what` names it in refusals ("inputs",
    "parameters.mask_image"). At most `max_pixels` pixels, judged from the header before decoding."""
    try:
        with warnings.catch_warnings():
            # PIL warns past its own bomb limit; ours is checked below, from the same header, first.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as e:
        raise InvalidRequestError(f"{what} is not an image ({len(data)} bytes: {e}); accepted: {ACCEPTED}") from e
    with opened:
        if opened.format not in ACCEPTED_FORMATS:
            raise InvalidRequestError(f"{what} is a {opened.format} image; accepted: {ACCEPTED}")
        width, height = opened.size
        if width * height > max_pixels:
            raise LimitExceededError(
                f"{what} is {width}x{height} ({width * height} pixels); accepted: at most {max_pixels} pixels "
                "(MAX_INPUT_PIXELS)"
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                # The first frame of an animation; the photo as a viewer turns it.
                upright = ImageOps.exif_transpose(opened)
                return InputImage.from_pil(upright, mode)
        except (Image.DecompressionBombError, OSError, ValueError, SyntaxError) as e:
            raise InvalidRequestError(f"{what} could not be decoded ({e}); accepted: {ACCEPTED}") from e
