"""The images a request brings (`GenerateRequest.image`, `.mask_image`, `.images`): an `EncodedImage` (a file as
sent, read only as far as its header) or an `InputImage` (pixels), and decoding the one into the other.

Count, then decode: every door (`POST /`, the Gradio API and the UI's slots, the cluster wire) carries a client's
file into the request as an `EncodedImage` (`encoded_image`: the format whitelisted, the size from the header
held to MAX_INPUT_PIXELS, nothing decoded), so that `normalise_request` counts the images and weighs their pixels
before any is decoded (`engine.image_checks`): a 340-byte WebP that decodes to 21 MB costs its header until
then. An `EncodedImage` is frozen, hashable and compared by its bytes and mode (a request equals its copy,
whichever transport carried it; the name a door gave it for refusals is not compared).

An `InputImage` is the pixels themselves, 8-bit RGB (a mask: 8-bit grayscale, `L`), with their size: frozen,
hashable and compared by value (the checked request's images; the UI editor's composite). `to_pil()` makes a new
PIL image each time, so no run can change another's input. One decoded from a file keeps the file (`source`, not
compared): the cluster's wire sends the client's own bytes back and forth instead of a PNG of the pixels.

`decode_image` is the one way bytes become an image: only the formats in `ACCEPTED_FORMATS` are parsed at all
(`Image.open(formats=...)`: no other PIL plugin reads untrusted bytes; a phone's MPO is a JPEG, its first frame);
the size is read from the file's header and checked against the limit **before** the pixels are decoded (a
decompression bomb is refused by its header, never decoded); an EXIF orientation is applied, as a viewer shows the
photo (an `EncodedImage`'s size is already the upright one, where the header says how the photo turns); 16-bit
grayscale is scaled to 8 bits (never clipped to white). Every refusal is an InvalidRequestError naming the value and
what is accepted, never a Python object's repr. `cap_decoding` sets PIL's own bomb limit from MAX_INPUT_PIXELS at
start: a safety net for the libraries that open images themselves (Gradio's upload handling).
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Literal

from PIL import Image, ImageOps, UnidentifiedImageError

from engine.errors import InvalidRequestError, LimitExceededError

__all__ = [
    "ACCEPTED_FORMATS",
    "ACCEPTED_MEDIA_TYPES",
    "DEFAULT_MAX_INPUT_PIXELS",
    "DEFAULT_MAX_REQUEST_PIXELS",
    "MOST_IMAGES",
    "EncodedImage",
    "ImageMode",
    "InputImage",
    "RequestImage",
    "cap_decoding",
    "decode_image",
    "encode_png",
    "encoded_image",
    "file_of",
    "open_image",
    "read_size",
]

# PIL's format names -> the media types a client sends them as.
ACCEPTED_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
# What PIL names an accepted file: a JPEG with more frames (a phone's MPO) is read as a JPEG, its first frame.
_READ_AS = {"PNG": "PNG", "JPEG": "JPEG", "MPO": "JPEG", "WEBP": "WEBP"}
# MAX_INPUT_PIXELS' default (engine.settings): 4 times the largest size preset's pixels (Qwen-Image's 1328 x 1328).
DEFAULT_MAX_INPUT_PIXELS = 4 * 1328 * 1328
# MAX_REQUEST_PIXELS' default, all of a request's images' pixels together (about 85 MB once decoded in RGB): the
# largest pool's count (FLUX.2 [dev]'s 6 images) of 4.7 MP photos, or 4 images (FLUX.2 [klein]'s count) each at
# MAX_INPUT_PIXELS' default.
DEFAULT_MAX_REQUEST_PIXELS = 4 * DEFAULT_MAX_INPUT_PIXELS
# The most images a request may bring in all, whatever the pool (MAX_REFERENCE_IMAGES' ceiling; FLUX.2 [dev]'s 6 is
# the most a pool takes): a door refuses more before it reads a single header.
MOST_IMAGES = 16
# EXIF orientations that turn the photo a quarter (its stored width is its shown height).
_QUARTER_TURNS = (5, 6, 7, 8)
_ORIENTATION = 0x0112
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


class _Sized:
    """The size and pixel count both kinds of request image give from their `width` and `height`."""

    width: int
    height: int

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class InputImage(_Sized):
    """An image of a request: `width` x `height` pixels in `mode`, row-major bytes (`PIL.Image.tobytes()`)."""

    width: int
    height: int
    mode: ImageMode
    data: bytes = field(repr=False)
    # The file these pixels were decoded from (`decode_image`), if they are exactly what it decodes to in `mode`;
    # b"": made in code. Not compared: the same pixels are the same image whatever carried them.
    source: bytes = field(default=b"", repr=False, compare=False)

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


@dataclass(frozen=True)
class EncodedImage(_Sized):
    """A client's image file as sent (PNG, JPEG or WebP bytes), read as far as its header (`encoded_image`): its
    upright `width` x `height` and the `mode` it is decoded in; no pixel decoded yet. `name`: what the door called
    it ("parameters.images[1]"), for a refusal after the door (not compared)."""

    data: bytes = field(repr=False)
    width: int
    height: int
    mode: ImageMode = "RGB"
    name: str = field(default="", compare=False)

    def decoded(self, max_pixels: int, what: str = "the image") -> InputImage:
        """The pixels (`decode_image`, the one decode), at most `max_pixels`; refusals name the door's name for it,
        else `what`."""
        return decode_image(self.data, what=self.name or what, max_pixels=max_pixels, mode=self.mode)


# An image a request may carry: a file as sent, or pixels (a checked request's are pixels).
RequestImage = InputImage | EncodedImage


def encoded_image(data: bytes, *, what: str, max_pixels: int, mode: ImageMode = "RGB") -> EncodedImage:
    """`data` (a PNG, JPEG or WebP file) carried as sent, refused as `decode_image` refuses it by its header (a
    format not accepted, over `max_pixels`); nothing is decoded. `what` names it in refusals, here and after."""
    with _opened(data, what, max_pixels) as opened:
        width, height = _within(opened.size, what, max_pixels)
        if _orientation(opened) in _QUARTER_TURNS:
            width, height = height, width
    return EncodedImage(data, width, height, mode, what)


def file_of(image: RequestImage) -> bytes:
    """A file that decodes to `image` in its mode: the client's own (as sent, or what its pixels came from), else
    a PNG of its pixels (lossless)."""
    if isinstance(image, EncodedImage):
        return image.data
    return image.source or encode_png(image)


def _orientation(opened: Image.Image) -> int:
    """The orientation the header says (EXIF, or XMP's `tiff:Orientation`, as `ImageOps.exif_transpose` reads it
    when decoding), read without decoding: PIL's own `Image.getexif` over what the open read (a PNG's own override
    would decode the file to find an eXIf chunk after its pixels); 1 (as stored) when none or unreadable."""
    try:
        value = Image.Image.getexif(opened).get(_ORIENTATION, 1)
    except (OSError, ValueError, SyntaxError, EOFError, KeyError, IndexError, TypeError):
        return 1
    return value if isinstance(value, int) else 1


def cap_decoding(max_pixels: int) -> None:
    """PIL's own bomb limit from MAX_INPUT_PIXELS (PIL refuses past twice it): for what opens images besides
    `decode_image`, which judges the header against `max_pixels` itself."""
    Image.MAX_IMAGE_PIXELS = max_pixels


def decode_image(data: bytes, *, what: str, max_pixels: int, mode: ImageMode = "RGB") -> InputImage:
    """`data` (a PNG, JPEG or WebP file) as an `InputImage` in `mode`; `what` names it in refusals ("inputs",
    "parameters.mask_image"). At most `max_pixels` pixels, judged from the header before decoding."""
    decoded = InputImage.from_pil(open_image(data, what=what, max_pixels=max_pixels), mode)
    return replace(decoded, source=data)


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
