"""Comparing images made by different pipelines, engines, processes, thread counts or weight storage.

Those agree within rounding, not bit for bit: on some CPUs (an AMD EPYC with avx512_bf16, issue 28) the storage
a weight lives in (its alignment after a move through a flat host buffer, or as `from_pretrained` left it) picks
the kernel, and so the last bit of some sums; a thread count or a batch splits a sum differently. Such images
agree within `LEVELS` levels per channel. Byte-equality stays for the same weights in the same storage: the same
engine before and after, the same request twice (tests/README.md, "Comparing images").
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

# Levels per channel of an 8-bit image: a last-bit change in one sum moves a pixel by 1, rarely 2.
LEVELS = 2


def levels(image: Any) -> np.ndarray:
    """An image as int16 levels (height, width, RGB): a PIL image, a result holding `.image`, PNG or JPEG bytes,
    a uint8 array, or a float array in [0, 1] (diffusers' `output_type="np"`, rounded as diffusers rounds it)."""
    if hasattr(image, "image"):
        image = image.image
    if isinstance(image, bytes | bytearray):
        with Image.open(io.BytesIO(image)) as decoded:
            image = decoded.convert("RGB")
    if isinstance(image, Image.Image):
        image = image.convert("RGB")
    array = np.asarray(image)
    if array.dtype.kind == "f":
        array = (array * 255).round()
    return array.astype(np.int16)


def level_difference(a: Any, b: Any) -> int:
    """The largest difference, in levels, of any channel of any pixel."""
    first, second = levels(a), levels(b)
    assert first.shape == second.shape, (first.shape, second.shape)
    return int(np.abs(first - second).max())


def assert_images_close(a: Any, b: Any, what: object = None, *, tolerance: int = LEVELS) -> None:
    """`a` and `b` are the same image within `tolerance` levels per channel (see the module's docstring)."""
    difference = level_difference(a, b)
    assert difference <= tolerance, (what, f"{difference} levels apart; accepted: {tolerance}")
