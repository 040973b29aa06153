"""The images a request brings: decoding (formats, the size from the header, EXIF), the frozen `InputImage`, the
checks `normalise_request` makes, and the MAX_INPUT_PIXELS default held to the families' presets."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from PIL import Image

from engine.errors import InvalidRequestError, LimitExceededError
from engine.families.registry import served_specs
from engine.images import InputImage, decode_image
from engine.normalise import normalise_request
from engine.requests import GenerateRequest, Limits, ModelDefaults
from engine.settings import Settings
from tests.support.image_inputs import example_image, input_image, input_mask, png_bytes

LIMITS = Limits(max_loras=4, max_steps=60, max_prompt_chars=100)
ALL_MODES = ("text-to-image", "image-to-image", "inpainting")
DEFAULTS = ModelDefaults(steps=10, guidance=5.0, side=64, max_side=128, strength=0.3, inpaint_strength=0.9999)
DEFAULTS = replace(DEFAULTS, modes=ALL_MODES)


def test_max_input_pixels_is_four_times_the_largest_size_preset():
    largest = max(w * h for spec in served_specs() for w, h in spec.size_buckets)
    assert Settings().max_input_pixels == 4 * largest


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_each_accepted_format_decodes_to_the_same_size(fmt):
    decoded = decode_image(png_bytes(example_image(48, 40), fmt), what="inputs", max_pixels=10_000)
    assert (decoded.size, decoded.mode) == ((48, 40), "RGB")


def test_an_exif_rotation_is_applied_as_a_viewer_shows_it():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: the stored 48 x 40 shows as 40 x 48
    out = io.BytesIO()
    example_image(48, 40).save(out, format="JPEG", exif=exif)
    assert decode_image(out.getvalue(), what="inputs", max_pixels=10_000).size == (40, 48)


def test_the_pixel_limit_is_judged_from_the_header():
    with pytest.raises(LimitExceededError, match=r"inputs is 64x64 \(4096 pixels\); accepted: at most 4095"):
        decode_image(png_bytes(example_image()), what="inputs", max_pixels=4095)


def test_an_input_image_is_frozen_and_compared_by_value():
    first, again = input_image(), input_image()
    assert first == again and hash(first) == hash(again) and first != input_image(seed=1)
    assert first.to_pil() is not first.to_pil() and first.to_pil().tobytes() == first.data
    with pytest.raises(ValueError, match="not a 4x4 RGB image"):
        InputImage(4, 4, "RGB", b"123")


def test_an_image_request_takes_the_images_size_rounded_and_the_modes_default_strength():
    request = GenerateRequest(prompt="", image=InputImage.from_pil(example_image(70, 75)))
    checked = normalise_request(request, DEFAULTS, LIMITS)
    assert (checked.width, checked.height, checked.strength, checked.mode) == (72, 72, 0.3, "image-to-image")
    inpainting = normalise_request(replace(request, mask_image=input_mask()), DEFAULTS, LIMITS)
    assert inpainting.strength == 0.9999 and inpainting.mode == "inpainting"
    assert "resized to the image's size" in DEFAULTS.ignored(inpainting)[0]


@pytest.mark.parametrize(
    ("fields", "defaults", "match"),
    [
        ({"strength": 1.5}, DEFAULTS, r"strength=1.5 is out of range; accepted: a number from 0 to 1"),
        ({"strength": 0.05}, DEFAULTS, r"runs no denoising step; accepted: a strength from 0.1 to 1"),
        ({"image": None, "strength": 0.5}, DEFAULTS, r"strength=0.5 was given without an image"),
        ({"image": None, "mask_image": input_mask()}, DEFAULTS, "mask_image was given without an image"),
        ({"image": b"png"}, DEFAULTS, "image is a bytes; accepted: a PNG, JPEG or WebP image"),
        ({}, ModelDefaults(steps=4, guidance=0.0, side=64, max_side=128), "no image-to-image pipeline; accepted"),
        ({"image": None}, replace(DEFAULTS, modes=("image-to-image",), needs_image=True), "needs one"),
        ({"image": InputImage.from_pil(example_image(200, 64))}, DEFAULTS, r"200x64, over this pool's largest"),
    ],
)
def test_bad_image_requests_are_refused_naming_the_value_and_what_is_accepted(fields, defaults, match):
    request = GenerateRequest(prompt="a fox", steps=10, **{"image": input_image(), **fields})
    with pytest.raises(InvalidRequestError, match=match):
        normalise_request(request, defaults, LIMITS)
