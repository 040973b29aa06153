"""The one check of a request's further reference images (`engine.normalise`): each an image, after the first,
within the pool's limit (`ModelDefaults.max_reference_images`) and MAX_REFERENCE_IMAGES, with a mask only where
the pool's inpainting takes references; every refusal names the value and what is accepted."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError, LimitExceededError
from engine.normalise import normalise_request
from engine.requests import GenerateRequest, Limits, ModelDefaults
from engine.settings import Settings
from tests.support.image_inputs import input_image, input_mask

LIMITS = Limits(max_loras=4, max_steps=50, max_prompt_chars=200)
EDITING = ("text-to-image", "image-to-image", "inpainting")


def defaults(most: int, *, modes: tuple = EDITING, inpaint_references: bool = False) -> ModelDefaults:
    return ModelDefaults(
        steps=4,
        guidance=1.0,
        side=64,
        max_side=128,
        modes=modes,
        max_reference_images=most,
        inpaint_references=inpaint_references,
    )


def request(count: int, **fields: object) -> GenerateRequest:
    images = tuple(input_image(seed=i) for i in range(1, count + 1))
    return GenerateRequest(
        **({"prompt": "image 1 in image 2's style", "image": input_image(), "images": images} | fields)
    )  # type: ignore[arg-type]


def test_references_within_the_pools_limit_pass_in_order():
    checked = normalise_request(request(3), defaults(4), LIMITS)
    assert checked.images == request(3).images and checked.mode == "image-to-image"
    assert normalise_request(request(0), defaults(1), LIMITS).images == ()


@pytest.mark.parametrize(
    ("pool", "count", "error", "message"),
    [
        (1, 1, InvalidRequestError, r"images \(1 image\) were given, but this pool's model takes one image; accepted"),
        (0, 1, InvalidRequestError, r"takes no image \(it is text-to-image only\); accepted: at most 0 images"),
        (4, 4, LimitExceededError, r"5 images were given \(the image and 4 images in images\); this pool's model ta"),
    ],
)
def test_more_images_than_the_pool_takes_are_refused_naming_its_limit(pool, count, error, message):
    with pytest.raises(error, match=message) as e:
        normalise_request(request(count), defaults(pool), LIMITS)
    assert e.value.status == 400


def test_max_reference_images_caps_every_pool():
    capped = Limits.of(Settings(max_reference_images=2))
    assert Limits.of(Settings()).max_reference_images is None
    with pytest.raises(LimitExceededError, match=r"this Space's MAX_REFERENCE_IMAGES allows at most 2; accepted"):
        normalise_request(request(2), defaults(6), capped)
    assert len(normalise_request(request(1), defaults(6), capped).images) == 1


def test_references_without_the_image_or_not_images_are_refused_by_name():
    with pytest.raises(InvalidRequestError, match=r"images \(2 images\) were given without the first image"):
        normalise_request(request(2, image=None), defaults(4), LIMITS)
    with pytest.raises(InvalidRequestError, match=r"images\[1\] is a str; accepted: a list of images, each a PNG"):
        normalise_request(request(0, images=(input_image(), "x.png")), defaults(4), LIMITS)


def test_a_mask_with_references_needs_a_pool_whose_inpainting_takes_them():
    masked = request(1, mask_image=input_mask(), strength=0.8)
    with pytest.raises(InvalidRequestError, match=r"mask_image was given with images \(1 image\), and this pool's"):
        normalise_request(masked, defaults(4), LIMITS)
    checked = normalise_request(masked, defaults(4, inpaint_references=True), LIMITS)
    assert checked.mode == "inpainting" and len(checked.images) == 1
