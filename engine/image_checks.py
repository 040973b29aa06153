"""A request's images checked for `engine.normalise.normalise_request` (the one gate): counted, weighed by their
headers, and only then decoded.

Policy: no image is decoded before the request is known to fit. Every door carries a client's file into the request
as it came (`engine.images.EncodedImage`: its bytes and its header's size, the format whitelisted and the size held
to MAX_INPUT_PIXELS there), so that here, in order and from headers alone: the fields are images, and a mask or
further references come with the image; the images' count (`image` and `images`) is within the pool's limit and
MAX_REFERENCE_IMAGES; each image's (and the mask's) pixels are within MAX_INPUT_PIXELS, and all of them together
within MAX_REQUEST_PIXELS. Then each is decoded (`EncodedImage.decoded`: `engine.images.decode_image`, the one
decode), on the checking thread; an image made in code (`InputImage`: the UI editor's composite, a request checked
before) is checked the same way and kept. A door may also refuse a count past what any pool takes
(`check_door_count`) before it reads a single header: a 32 MiB body holds some 73,000 tiny WebPs.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import InvalidRequestError, LimitExceededError
from engine.images import ACCEPTED as IMAGE_ACCEPTED
from engine.images import MOST_IMAGES, EncodedImage, InputImage, RequestImage
from engine.requests import GenerateRequest, Limits, ModelDefaults

__all__ = ["CheckedImages", "check_door_count", "checked_images"]

_IMAGES_ACCEPTED = f"a list of images, each {IMAGE_ACCEPTED} (or none)"
# The request's image, its mask and its further references, decoded.
CheckedImages = tuple[InputImage | None, InputImage | None, tuple[InputImage, ...]]


def check_door_count(references: int, cap: int | None) -> None:
    """At a door, before any header is read: refuse `references` further images (after the first) past `cap`
    images in all (MAX_REFERENCE_IMAGES; None: `MOST_IMAGES`, more than any pool takes). Within it, the pool's own
    limit is `normalise_request`'s to hold."""
    most = MOST_IMAGES if cap is None else cap
    if 1 + references <= most:
        return
    whose = "no pool takes more than" if cap is None else "this Space's MAX_REFERENCE_IMAGES allows at most"
    raise LimitExceededError(
        f"{1 + references} images were given (the image and {_count(references)} in images); {whose} {most}; "
        f"accepted: the image and up to {most - 1} in images"
    )


def checked_images(request: GenerateRequest, defaults: ModelDefaults, limits: Limits) -> CheckedImages:
    """The request's image, mask and further references, checked as the module docstring says, then decoded."""
    _check_fields(request)
    references = _references(request, defaults, limits)
    firsts = (("image", request.image), ("mask_image", request.mask_image))
    named = [(name, first) for name, first in firsts if first is not None]
    named += [(f"images[{index}]", reference) for index, reference in enumerate(references)]
    for name, each in named:
        _check_pixels(name, each, limits)
    _check_budget(named, limits)
    image, mask = (_decoded(name, request, limits) for name in ("image", "mask_image"))
    return image, mask, tuple(_image(f"images[{i}]", each, limits) for i, each in enumerate(references))


def _check_fields(request: GenerateRequest) -> None:
    """The image and mask are images; a mask or further references come with the image."""
    for name in ("image", "mask_image"):
        value = getattr(request, name)
        if value is not None and not isinstance(value, InputImage | EncodedImage):
            raise InvalidRequestError(f"{name} is a {type(value).__name__}; accepted: {IMAGE_ACCEPTED} (or none)")
    if request.mask_image is not None and request.image is None:
        raise InvalidRequestError("mask_image was given without an image; accepted: a mask with the image it masks")
    if request.images and request.image is None:
        raise InvalidRequestError(
            f"images ({_count(request.images)}) were given without the first image; accepted: further references "
            "after an image (the first is the request's image, the HTTP body's inputs)"
        )


def _references(request: GenerateRequest, defaults: ModelDefaults, limits: Limits) -> tuple[RequestImage, ...]:
    """The further reference images as a tuple, their count within the pool's limit (and the MAX_REFERENCE_IMAGES
    setting's) before anything of them is read; with a mask only where the pool's inpainting takes references."""
    value = request.images
    if value is None or (not value and isinstance(value, list | tuple)):
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"images is a {type(value).__name__}; accepted: {_IMAGES_ACCEPTED}")
    pool = defaults.max_reference_images
    if pool <= 1:
        takes = "takes no image (it is text-to-image only)" if pool == 0 else "takes one image"
        raise InvalidRequestError(
            f"images ({_count(value)}) were given, but this pool's model {takes}; accepted: at most {pool} "
            f"image{'s' if pool != 1 else ''} in all, so no images"
        )
    cap = pool if limits.max_reference_images is None else min(pool, limits.max_reference_images)
    if 1 + len(value) > cap:
        whose = "this pool's model takes" if cap == pool else "this Space's MAX_REFERENCE_IMAGES allows"
        raise LimitExceededError(
            f"{1 + len(value)} images were given (the image and {_count(value)} in images); {whose} at most {cap}; "
            f"accepted: the image and up to {cap - 1} in images"
        )
    for index, image in enumerate(value):
        if not isinstance(image, InputImage | EncodedImage):
            raise InvalidRequestError(f"images[{index}] is a {type(image).__name__}; accepted: {_IMAGES_ACCEPTED}")
    if request.mask_image is not None and not defaults.inpaint_references:
        raise InvalidRequestError(
            f"mask_image was given with images ({_count(value)}), and this pool's inpainting takes one image; "
            "accepted: a mask with the one image it masks, or references without a mask"
        )
    return tuple(value)


def _check_pixels(name: str, image: RequestImage, limits: Limits) -> None:
    """An image within MAX_INPUT_PIXELS (a door held its file's header to it; an image made in code meets it here)."""
    if image.pixels > limits.max_input_pixels:
        raise LimitExceededError(
            f"{name} is {image.width}x{image.height} ({image.pixels} pixels); accepted: at most "
            f"{limits.max_input_pixels} pixels (MAX_INPUT_PIXELS)"
        )


def _check_budget(named: Sequence[tuple[str, RequestImage]], limits: Limits) -> None:
    """All the request's images (its mask too) within MAX_REQUEST_PIXELS together: what decoding them all costs."""
    total = sum(image.pixels for _, image in named)
    if total > limits.max_request_pixels:
        sizes = ", ".join(f"{name} {image.width}x{image.height}" for name, image in named)
        raise LimitExceededError(
            f"the request's images are {total} pixels in all ({sizes}); accepted: at most "
            f"{limits.max_request_pixels} pixels in all (MAX_REQUEST_PIXELS)"
        )


def _decoded(name: str, request: GenerateRequest, limits: Limits) -> InputImage | None:
    image = getattr(request, name)
    return None if image is None else _image(name, image, limits)


def _image(name: str, image: RequestImage, limits: Limits) -> InputImage:
    """`image`'s pixels: a file decoded (the door's name for it in a refusal, else `name`), pixels as they are."""
    return image.decoded(limits.max_input_pixels, name) if isinstance(image, EncodedImage) else image


def _count(images: object) -> str:
    count = images if isinstance(images, int) else len(images) if isinstance(images, list | tuple) else 1
    return f"{count} image{'s' if count != 1 else ''}"
