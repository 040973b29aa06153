"""The images a request brings (`GenerateRequest.image`, `.mask_image`): `InputImage`, and decoding a file's bytes
into one.

An `InputImage` is the pixels themselves, 8-bit RGB (a mask: 8-bit grayscale, `L`), with their size: frozen,
hashable and compared by value, as the frozen request needs (a request equals its copy, whichever transport
carried it). `to_pil()` makes a new PIL image each time, so no run can change another's input.

`decode_image` is the one way bytes become an image, on every door (`POST /`, the Gradio API and the UI's
editor, the cluster wire): only the formats in `ACCEPTED_FORMATS` are parsed at all (`Image.open(formats=...)`:
no other PIL plugin reads untrusted bytes; a phone's MPO is a JPEG, its first frame); the size is read from the
file's header and checked against the limit **before** the pixels are decoded (a decompression bomb is refused
by its header, never decoded); an EXIF orientation is applied, as a viewer shows the photo; 16-bit grayscale is
scaled to 8 bits (never clipped to white). Every refusal is an InvalidRequestError naming the value and what is
accepted, never a Python object's repr. `cap_decoding` sets PIL's own bomb limit from MAX_INPUT_PIXELS at start:
a safety net for the libraries that open images themselves (Gradio's upload handling).
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass, field
from typing import Literal

from PIL import Image, ImageOps, UnidentifiedImageError

from engine.errors import InvalidRequestError, LimitExceededError

__all__ = [
    "ACCEPTED_FORMATS",
    "ACCEPTED_MEDIA_TYPES",
    "DEFAULT_MAX_INPUT_PIXELS",
    "ImageMode",
    "InputImage",
    "cap_decoding",
    "decode_image",
    "encode_png",
    "open_image",
    "read_size",
]

# PIL's format names -> the media types a client sends them as.
ACCEPTED_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
# What PIL names an accepted file: a JPEG with more frames (a phone's MPO) is read as a JPEG, its first frame.
_READ_AS = {"PNG": "PNG", "JPEG": "JPEG", "MPO": "JPEG", "WEBP": "WEBP"}
# MAX_INPUT_PIXELS' default (engine.settings): 4 times the largest size preset's pixels (Qwen-Image's 1328 x 1328).
DEFAULT_MAX_INPUT_PIXELS = 4 * 1328 * 1328
# How files of formats never parsed here start, to name what a refused file is (the first bytes only).
_OTHER_FORMATS = (
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"8BPS", "PSD"),
)
_PIL_PIXELS = re.compile(r"\((\d+) pixels\)")
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


def cap_decoding(max_pixels: int) -> None:
    """PIL's own bomb limit from MAX_INPUT_PIXELS (PIL refuses past twice it): for what opens images besides
    `decode_image`, which judges the header against `max_pixels` itself."""
    Image.MAX_IMAGE_PIXELS = max_pixels


def decode_image(data: bytes, *, what: str, max_pixels: int, mode: ImageMode = "RGB") -> InputImage:
    """`data` (a PNG, JPEG or WebP file) as an `InputImage` in `mode`; `what` names it in refusals ("inputs",
    "parameters.mask_image"). At most `max_pixels` pixels, judged from the header before decoding."""
    return InputImage.from_pil(open_image(data, what=what, max_pixels=max_pixels), mode)


def open_image(data: bytes, *, what: str, max_pixels: int) -> Image.Image:
    """`data` decoded as `decode_image` decodes it, in PIL's mode for it (8-bit channels; transparency kept, for
    a caller that lays it on a colour: the UI's editor)."""
    opened = _opened(data, what, max_pixels)
    with opened:
        _within(opened.size, what, max_pixels)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                # The first frame of an animation or an MPO; the photo as a viewer turns it.
                upright = ImageOps.exif_transpose(opened)
                upright.load()
                return _eight_bit(upright, what)
        except (Image.DecompressionBombError, OSError, ValueError, SyntaxError, EOFError) as e:
            raise InvalidRequestError(f"{what} could not be decoded ({e}); accepted: {ACCEPTED}") from e


def read_size(data: bytes, *, what: str, max_pixels: int) -> tuple[int, int]:
    """`data`'s width and height from its header alone (nothing decoded), refused as `decode_image` refuses it:
    for a caller that hands the file to a library that decodes it (Gradio's editor)."""
    with _opened(data, what, max_pixels) as opened:
        return _within(opened.size, what, max_pixels)


def _within(size: tuple[int, int], what: str, max_pixels: int) -> tuple[int, int]:
    width, height = size
    if width * height > max_pixels:
        raise _over(what, f"{width}x{height} ({width * height} pixels)", max_pixels)
    return size


def _opened(data: bytes, what: str, max_pixels: int) -> Image.Image:
    """`data` opened (its header read, nothing decoded) by the accepted formats' plugins only."""
    try:
        with warnings.catch_warnings():
            # PIL warns past its own bomb limit; ours is checked from the same header by the caller.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=tuple(ACCEPTED_FORMATS))
    except Image.DecompressionBombError as e:
        # Past twice PIL's limit (`cap_decoding`): PIL refuses before the size is ours to read.
        counted = _PIL_PIXELS.search(str(e))
        pixels = counted.group(1) if counted else "too many"
        raise _over(what, f"an image of {pixels} pixels", max_pixels) from e
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        # PIL's message names the stream object, not the input: ours says what the bytes are.
        named = next((name for magic, name in _OTHER_FORMATS if data.startswith(magic)), None)
        found = f"a {named} image" if named else f"not an image ({len(data)} bytes, starting {data[:8]!r})"
        raise InvalidRequestError(f"{what} is {found}; accepted: {ACCEPTED}") from e
    if opened.format not in _READ_AS:
        opened.close()
        raise InvalidRequestError(f"{what} is a {opened.format} image; accepted: {ACCEPTED}")
    return opened


def _over(what: str, size: str, max_pixels: int) -> LimitExceededError:
    return LimitExceededError(f"{what} is {size}; accepted: at most {max_pixels} pixels (MAX_INPUT_PIXELS)")


def _eight_bit(image: Image.Image, what: str) -> Image.Image:
    """`image` with 8-bit channels: 16-bit grayscale (`I;16*`, and `I` as PIL reads such a PNG) scaled by
    1/257 (65535 is white), not clipped at 255 as `convert` does; a float image is refused."""
    if image.mode == "F":
        raise InvalidRequestError(f"{what} is a 32-bit float image; accepted: {ACCEPTED} with 8 or 16 bits")
    if image.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N"):
        wide = image if image.mode == "I" else image.convert("I")
        return wide.point(lambda value: value / 257).convert("L")
    return image


def encode_png(image: InputImage) -> bytes:
    """`image` as a PNG file (lossless: `decode_image` gives the same pixels back)."""
    out = io.BytesIO()
    image.to_pil().save(out, format="PNG")
    return out.getvalue()
