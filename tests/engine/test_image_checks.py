"""Count, then decode (`engine.image_checks`): the images a door carried as files are counted against the pool's
limit and MAX_REFERENCE_IMAGES, each header held to MAX_INPUT_PIXELS and their sum to MAX_REQUEST_PIXELS, all before
a single one is decoded (`engine.images.decode_image` made to fail shows it); within every limit each file is
decoded once, by the one decode, into the pixels the run takes. A door refuses a count past what any pool takes
before it reads a header. Every door's refusal in time and memory: tests/serving/test_reference_doors_limits.py."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from PIL import Image

import engine.images
from engine.errors import LimitExceededError, SettingsError
from engine.families.registry import served_specs
from engine.image_checks import check_door_count
from engine.images import MOST_IMAGES, EncodedImage, InputImage, decode_image, encoded_image
from engine.normalise import normalise_request
from engine.requests import GenerateRequest, Limits, ModelDefaults
from engine.settings import Settings
from tests.support.image_inputs import example_image, png_bytes

LIMITS = Limits(max_loras=4, max_steps=60, max_prompt_chars=100)
# A pool that takes 4 images in all (FLUX.2 [klein]'s count), its references at their own sizes.
FOUR = ModelDefaults(
    steps=4, guidance=1.0, side=64, max_side=256, modes=("image-to-image",), max_reference_images=4
)  # fmt: skip


def solid_webp(side: int) -> bytes:
    """A solid-colour lossless WebP: a few hundred bytes of file, `side`² x 3 bytes once decoded."""
    out = io.BytesIO()
    Image.new("RGB", (side, side), (10, 200, 30)).save(out, format="WEBP", lossless=True)
    return out.getvalue()


def carried(data: bytes, what: str = "inputs") -> EncodedImage:
    """`data` as a door carries it: read as far as its header."""
    return encoded_image(data, what=what, max_pixels=LIMITS.max_input_pixels)


def edit(references: int, data: bytes) -> GenerateRequest:
    images = tuple(carried(data, f"parameters.images[{i}]") for i in range(references))
    return GenerateRequest(prompt="image 1 and image 2", image=carried(data), images=images, width=64, height=64)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every decode's file size, in order (the one decode: `engine.images.decode_image`)."""
    seen: list[int] = []
    decode = engine.images.decode_image

    def counted(data: bytes, **kwargs: object) -> InputImage:
        seen.append(len(data))
        return decode(data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.images, "decode_image", counted)
    return seen


def test_a_door_carries_the_file_and_its_headers_size_nothing_decoded(decodes):
    webp = solid_webp(2656)  # 340 bytes, 21 MB of pixels
    image = carried(webp)
    assert (image.data, image.size, image.mode, image.pixels) == (webp, (2656, 2656), "RGB", 2656 * 2656)
    assert image == carried(webp, "another door's name") and hash(image) == hash(carried(webp))
    assert decodes == []


def test_a_photos_exif_turn_is_its_headers_size_as_decoding_turns_it():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: the stored 48 x 40 shows as 40 x 48
    for fmt in ("JPEG", "WEBP", "PNG"):
        out = io.BytesIO()
        example_image(48, 40).save(out, format=fmt, exif=exif)
        image = carried(out.getvalue())
        assert image.size == (40, 48) == image.decoded(LIMITS.max_input_pixels).size, fmt


def test_more_images_than_the_pool_takes_are_refused_before_any_is_decoded(decodes):
    with pytest.raises(LimitExceededError, match=r"61 images were given .* this pool's model takes at most 4"):
        normalise_request(edit(60, solid_webp(2656)), FOUR, LIMITS)
    capped = replace(LIMITS, max_reference_images=2)
    with pytest.raises(LimitExceededError, match=r"3 images were given .* MAX_REFERENCE_IMAGES allows at most 2"):
        normalise_request(edit(2, solid_webp(64)), FOUR, capped)
    assert decodes == []


def test_a_header_over_max_input_pixels_is_refused_before_any_is_decoded(decodes):
    # A door with a higher limit (another Space's) carried it: this check holds its own.
    big = encoded_image(solid_webp(128), what="parameters.images[1]", max_pixels=10**6)
    request = replace(edit(1, solid_webp(64)), images=(carried(solid_webp(64)), big))
    with pytest.raises(LimitExceededError, match=r"images\[1\] is 128x128 \(16384 pixels\); accepted: at most 10000"):
        normalise_request(request, FOUR, replace(LIMITS, max_input_pixels=10_000))
    assert decodes == []


def test_the_images_pixels_together_are_held_to_max_request_pixels_before_any_is_decoded(decodes):
    # Four images of 96 x 96, each within MAX_INPUT_PIXELS (10000), 36864 pixels together.
    limits = replace(LIMITS, max_input_pixels=10_000, max_request_pixels=30_000)
    with pytest.raises(LimitExceededError) as refused:
        normalise_request(edit(3, solid_webp(96)), FOUR, limits)
    assert str(refused.value) == (
        "the request's images are 36864 pixels in all (image 96x96, images[0] 96x96, images[1] 96x96, images[2] "
        "96x96); accepted: at most 30000 pixels in all (MAX_REQUEST_PIXELS)"
    )
    assert refused.value.status == 400 and decodes == []
    # At the budget exactly, the request is checked and each file decoded.
    checked = normalise_request(edit(3, solid_webp(96)), FOUR, replace(limits, max_request_pixels=36_864))
    assert len(checked.images) == 3 and len(decodes) == 4


def test_within_every_limit_each_file_is_decoded_once_into_the_pixels_the_run_takes(decodes):
    first, second = png_bytes(example_image(64, 64, 0)), png_bytes(example_image(80, 64, 1), "JPEG")
    request = GenerateRequest(prompt="x", image=carried(first), images=(carried(second),), width=64, height=64)
    checked = normalise_request(request, FOUR, LIMITS)
    assert decodes == [len(first), len(second)]
    assert checked.image == decode_image(first, what="x", max_pixels=10**6)
    assert checked.images == (decode_image(second, what="x", max_pixels=10**6),)
    assert all(isinstance(image, InputImage) for image in (checked.image, *checked.images))
    # Checked again (a comparison's cells): pixels stay pixels, nothing is decoded again.
    assert normalise_request(checked, FOUR, LIMITS).images == checked.images and len(decodes) == 2


def test_a_door_refuses_a_count_past_what_any_pool_takes_before_reading_a_header():
    check_door_count(MOST_IMAGES - 1, None)
    with pytest.raises(LimitExceededError, match=rf"61 images were given .*no pool takes more than {MOST_IMAGES}"):
        check_door_count(60, None)
    check_door_count(2, 3)
    with pytest.raises(LimitExceededError, match=r"5 images were given .* MAX_REFERENCE_IMAGES allows at most 3"):
        check_door_count(4, 3)
    assert max(spec.max_reference_images for spec in served_specs()) <= MOST_IMAGES
    with pytest.raises(SettingsError, match="MAX_REFERENCE_IMAGES"):
        Settings.from_env({"MAX_REFERENCE_IMAGES": str(MOST_IMAGES + 1)})


def test_max_request_pixels_admits_the_largest_pools_count_of_photos():
    settings = Settings()
    largest = max(spec.max_reference_images for spec in served_specs())
    assert largest == 6  # FLUX.2 [dev]
    # A 12 MP phone photo is over MAX_INPUT_PIXELS; 2592 x 1728 (4.5 MP) is a camera's smaller size.
    assert largest * 2592 * 1728 <= settings.max_request_pixels == Limits.of(settings).max_request_pixels
    # FLUX.2 [klein]'s 4 images each at MAX_INPUT_PIXELS.
    assert 4 * settings.max_input_pixels <= settings.max_request_pixels
    assert Settings.from_env({"MAX_REQUEST_PIXELS": "5000000"}).max_request_pixels == 5_000_000
