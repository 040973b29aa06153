"""The images a request brings: decoding (formats, the size from the header, EXIF), the frozen `InputImage`, the
checks `normalise_request` makes, and the MAX_INPUT_PIXELS default held to the families' presets."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image, TiffImagePlugin

from engine.errors import InvalidRequestError, LimitExceededError
from engine.families.registry import served_specs
from engine.images import InputImage, _eight_bit, cap_decoding, decode_image
from engine.normalise import normalise_request
from engine.requests import GenerateRequest, Limits, ModelDefaults
from engine.settings import Settings
from tests.support.image_inputs import example_image, example_mask, input_image, input_mask, png_bytes

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


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_16_bit_png_is_scaled_to_8_bits_not_clipped_to_white(mode):
    # A 16-bit grayscale ramp (PIL reads it as I;16): 0 is black, 32896 mid grey, 65535 white.
    ramp = np.linspace(0, 65535, 64 * 64).round().astype(np.uint16).reshape(64, 64)
    wide = Image.fromarray(ramp)
    assert Image.open(io.BytesIO(_png(wide))).mode.startswith("I")
    decoded = np.asarray(decode_image(_png(wide), what="inputs", max_pixels=10_000, mode=mode).to_pil())
    levels = decoded if mode == "L" else decoded[..., 0]
    expected = ramp.astype(np.float64) / 257
    assert np.abs(levels - expected).max() <= 1
    assert levels.min() == 0 and levels.max() >= 254 and abs(int(levels[32, 0]) - 128) <= 2


def test_a_float_image_is_refused_naming_what_is_accepted():
    with pytest.raises(InvalidRequestError, match="inputs is a 32-bit float image; accepted"):
        _eight_bit(Image.new("F", (4, 4)), "inputs")


def test_a_phones_mpo_is_read_as_a_jpeg_its_first_frame():
    out = io.BytesIO()
    first, second = example_image(48, 40), example_image(48, 40, seed=1)
    first.save(out, format="MPO", save_all=True, append_images=[second])
    assert Image.open(io.BytesIO(out.getvalue())).format == "MPO"
    decoded = decode_image(out.getvalue(), what="inputs", max_pixels=10_000)
    jpeg = decode_image(png_bytes(first, "JPEG"), what="inputs", max_pixels=10_000)
    assert decoded.size == (48, 40) and decoded == jpeg


def test_only_the_accepted_formats_plugins_parse_the_bytes(monkeypatch):
    def parsed(*args: object) -> None:
        raise AssertionError("the TIFF plugin parsed untrusted bytes")

    monkeypatch.setattr(TiffImagePlugin.TiffImageFile, "_open", parsed)
    with pytest.raises(InvalidRequestError, match="inputs is a TIFF image; accepted: a PNG, JPEG or WebP image"):
        decode_image(png_bytes(example_image(), "TIFF"), what="inputs", max_pixels=10_000)


@pytest.mark.parametrize(
    "data", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, b"GIF89a" + b"0" * 20]
)
def test_a_refusal_names_the_input_never_a_python_objects_repr(data):
    with pytest.raises(InvalidRequestError) as refused:
        decode_image(data, what="inputs", max_pixels=10_000)
    assert "object at 0x" not in str(refused.value) and "inputs" in str(refused.value)
    assert "accepted: a PNG, JPEG or WebP image" in str(refused.value)


def test_past_pils_own_limit_the_refusal_is_ours_with_the_pixel_count(monkeypatch):
    # A 12000 x 12000 PNG of one colour: 0.1 MB of file, 144 million pixels. With PIL's limit at start from
    # MAX_INPUT_PIXELS (`cap_decoding`), PIL refuses it before its size reaches us: the refusal is still ours.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)
    cap_decoding(4 * 1328 * 1328)
    huge = _png(Image.new("L", (12000, 12000), 200))
    with pytest.raises(LimitExceededError, match=r"inputs is an image of 144000000 pixels; accepted: at most 7054336"):
        decode_image(huge, what="inputs", max_pixels=4 * 1328 * 1328)


def test_the_pixel_cap_holds_in_the_check_whichever_door_made_the_image():
    # An image made in code (a transport that decoded it itself) meets the same MAX_INPUT_PIXELS.
    capped = replace(LIMITS, max_input_pixels=64 * 64 - 1)
    request = GenerateRequest(prompt="a fox", steps=10, image=input_image(64, 64), width=64, height=64)
    with pytest.raises(LimitExceededError, match=r"image is 64x64 \(4096 pixels\); accepted: at most 4095 pixels"):
        normalise_request(request, DEFAULTS, capped)
    masked = replace(request, image=input_image(32, 32), mask_image=input_mask(64, 64))
    with pytest.raises(LimitExceededError, match=r"mask_image is 64x64"):
        normalise_request(masked, DEFAULTS, capped)
    assert Limits.of(Settings(max_input_pixels=5000)).max_input_pixels == 5000


def test_the_images_are_resized_to_the_output_when_checked_as_the_pipeline_would():
    image, mask = example_image(100, 90), example_mask(40, 40)
    request = GenerateRequest(
        prompt="a fox", steps=10, image=InputImage.from_pil(image), mask_image=InputImage.from_pil(mask, "L")
    )
    checked = normalise_request(replace(request, width=64, height=72), DEFAULTS, LIMITS)
    assert checked.image is not None and checked.mask_image is not None
    resized = image.resize((64, 72), Image.Resampling.LANCZOS)
    assert checked.image == InputImage.from_pil(resized)
    assert checked.mask_image == InputImage.from_pil(mask.resize((64, 72), Image.Resampling.LANCZOS), "L")
    # The mask's other size is said, though the checked request holds both at the output's size.
    assert any("mask_image is 40x40, the image 100x90" in w for w in DEFAULTS.ignored(checked))
    # Checked again (a comparison's cells), nothing changes and the note stays.
    again = normalise_request(checked, DEFAULTS, LIMITS)
    assert (again.image, again.mask_image, again.notes) == (checked.image, checked.mask_image, checked.notes)


EDITING = replace(DEFAULTS, strength=None, inpaint_strength=None, modes=("image-to-image",), needs_image=True)


@pytest.mark.parametrize("strength", [float("nan"), float("inf"), -5, 1.5, True, "0.5"])
def test_an_editing_pool_refuses_a_strength_out_of_range_by_name(strength):
    request = GenerateRequest(prompt="make it blue", steps=10, image=input_image(), strength=strength)
    with pytest.raises(InvalidRequestError, match=r"strength=.* accepted: a number from 0 to 1"):
        normalise_request(request, EDITING, LIMITS)


def test_an_editing_pool_drops_a_strength_it_does_not_take_with_a_warning():
    request = GenerateRequest(prompt="make it blue", steps=10, image=input_image(), strength=0.25)
    checked = normalise_request(request, EDITING, LIMITS)
    assert checked.strength is None
    assert EDITING.ignored(checked) == (
        "strength does not apply to this model (it edits the whole image); 0.25 ignored",
    )
