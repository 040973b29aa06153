"""What a pool's pipeline makes of each image it reads as a reference, and the warnings that say so.

A pipeline that takes a list of references (FLUX.2's `image=[...]`, Qwen-Image-Edit-2509/2511's) sizes each one
itself before its VAE reads it: FLUX.2 scales one over 1 MP down to it and center-crops its sides to its latent
multiple; Qwen-Image-Edit-2509/2511 scales every image to about 1 MP (and again to about 384 x 384 for its
Qwen2.5-VL encoder). The request's images are passed to it as sent, the first too (at its own size and aspect,
never stretched to the output's: the pipeline sizes it as it sizes the others), so what the model read can differ
from what the client sent: each such change is said in the answer's warnings, naming the image ("image 1 (the
image)", "image 2 (images[0])": the prompt's numbering), the size the client sent and the size read. The family
declares its pipeline's rule as numbers (`ReferenceFit`, in its `RunDefaults`): plain data, so the pool's
`ModelDefaults` carry it to every check, a cluster front end's included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import InvalidRequestError
from engine.images import InputImage

__all__ = ["ReferenceFit", "check_reference_sizes", "reference_notes"]


@dataclass(frozen=True)
class ReferenceFit:
    """diffusers' own sizing of each reference image, as numbers.

    `always`: every image is scaled to about `area` pixels at its aspect ratio, each side rounded to `multiple`
    (Qwen-Image-Edit-2509/2511's `calculate_dimensions`). Otherwise only an image over `area` is scaled down to it
    (its sides truncated), then each side is floored to `multiple` by a center crop (FLUX.2's call).
    `encoder_area`: the text encoder's own view of each image, sized as `always` does (Qwen2.5-VL's about
    384 x 384); 0: the encoder reads no image. `min_side` and `max_ratio`: what the call refuses (FLUX.2's
    `check_image_input`: a side under 64, an aspect ratio over 8); 0: nothing. `inpaint_first_size`: its
    inpainting pipeline reads every reference at the first reference's size (FLUX.2 [klein]'s `image_reference`),
    and checks none."""

    area: int
    multiple: int
    always: bool = False
    encoder_area: int = 0
    min_side: int = 0
    max_ratio: float = 0.0
    inpaint_first_size: bool = False

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the pipeline's VAE reads an image of this size at."""
        if self.always:
            return _about(self.area, width / height, self.multiple)
        if width * height > self.area:
            scale = math.sqrt(self.area / (width * height))
            width, height = int(width * scale), int(height * scale)
        return width // self.multiple * self.multiple, height // self.multiple * self.multiple

    def how(self, width: int, height: int) -> str:
        """How an image of this size is changed (for a warning)."""
        if self.always:
            return f"scaled to about {self.area} pixels, sides in multiples of {self.multiple}"
        scaled = f"scaled to within {self.area} pixels, then " if width * height > self.area else ""
        return f"{scaled}center-cropped to sides in multiples of {self.multiple}"


def _about(area: int, ratio: float, multiple: int) -> tuple[int, int]:
    width = math.sqrt(area * ratio)
    return round(width / multiple) * multiple, round(width / ratio / multiple) * multiple


def _named(image: InputImage | None, images: Sequence[InputImage], inpainting: bool) -> list[tuple[str, InputImage]]:
    """The images the pipeline reads as references, in the prompt's numbering: the request's first (as sent) unless
    an inpainting repaints it, then its further `images`."""
    named = [(f"image {index + 2} (images[{index}])", reference) for index, reference in enumerate(images)]
    if image is not None and not inpainting:
        named.insert(0, ("image 1 (the image)", image))
    return named


def check_reference_sizes(
    image: InputImage | None, images: Sequence[InputImage], fit: ReferenceFit | None, *, inpainting: bool = False
) -> None:
    """Refuse, naming it, an image the pipeline's call would refuse (`min_side`, `max_ratio`): a 400, not a
    failed run."""
    if fit is None or (inpainting and fit.inpaint_first_size):
        return
    accepted = f"accepted: images of sides {fit.min_side} px or more, at most {fit.max_ratio:g}:1"
    for name, reference in _named(image, images, inpainting):
        width, height = reference.size
        if min(width, height) < fit.min_side:
            raise InvalidRequestError(f"{name} is {width}x{height}, under this pool's {fit.min_side} px; {accepted}")
        if fit.max_ratio and max(width / height, height / width) > fit.max_ratio:
            raise InvalidRequestError(
                f"{name} is {width}x{height}, an aspect ratio over this pool's {fit.max_ratio:g}:1; {accepted}"
            )


def reference_notes(
    image: InputImage | None, images: Sequence[InputImage], fit: ReferenceFit | None, *, inpainting: bool = False
) -> tuple[str, ...]:
    """A warning for each image the pipeline reads at another size than it was given (see `_named`)."""
    if fit is None:
        return ()
    first = fit.size(*images[0].size) if images and inpainting and fit.inpaint_first_size else None
    notes = []
    for name, reference in _named(image, images, inpainting):
        width, height = reference.size
        read = first or fit.size(width, height)
        if read == (width, height):
            continue
        how = "resized and center-cropped to the first reference's" if first else fit.how(width, height)
        note = f"{name} is {width}x{height}: the pipeline reads it at {read[0]}x{read[1]} ({how})"
        if fit.encoder_area:
            encoder = _about(fit.encoder_area, width / height, fit.multiple)
            note += f", and its text encoder at {encoder[0]}x{encoder[1]}"
        notes.append(note)
    return tuple(notes)
