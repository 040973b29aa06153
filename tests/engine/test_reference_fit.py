"""What a pool's pipeline makes of each reference image (`engine.references`), against diffusers' own sizing:
Qwen-Image-Edit-2509/2511's `calculate_dimensions` (about 1 MP for the VAE, about 384 x 384 for Qwen2.5-VL) and
FLUX.2's scaling of an image over 1 MP (`Flux2ImageProcessor._resize_to_target_area`) before its center crop; the
warnings name each changed image in the prompt's numbering with both sizes, and what FLUX.2's call would refuse
(`check_image_input`) is a 400 naming the image. The tiny klein pool's crop, read from its own call, and every
door's warnings: tests/serving/test_references_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
    CONDITION_IMAGE_SIZE,
    VAE_IMAGE_SIZE,
    calculate_dimensions,
)
from PIL import Image

from engine.errors import InvalidRequestError
from engine.families import flux2, qwen_image_edit_plus
from engine.normalise import normalise_request
from engine.references import check_reference_sizes, reference_notes
from engine.requests import GenerateRequest, Limits, ModelDefaults
from tests.support.image_inputs import input_image, input_mask

# A real pipeline's VAE scale (8): FLUX.2's sides in 16s.
PIPE = SimpleNamespace(vae_scale_factor=8, config=SimpleNamespace(is_distilled=True))
QWEN = qwen_image_edit_plus.FAMILY.defaults(PIPE).reference_fit  # type: ignore[arg-type]
FLUX2 = flux2.defaults(PIPE).reference_fit  # type: ignore[arg-type]
SIZES = ((64, 64), (512, 512), (1000, 700), (333, 1217), (2048, 1536), (1024, 1024))


@pytest.mark.parametrize("size", SIZES)
def test_qwen_edit_plus_reads_each_reference_at_diffusers_own_sizes(size):
    assert QWEN is not None and QWEN.size(*size) == calculate_dimensions(VAE_IMAGE_SIZE, size[0] / size[1])
    (note,) = reference_notes(None, [input_image(*size)], QWEN) or ("",)
    vae, encoder = QWEN.size(*size), calculate_dimensions(CONDITION_IMAGE_SIZE, size[0] / size[1])
    if vae != size:
        assert note.startswith(f"image 2 (images[0]) is {size[0]}x{size[1]}: the pipeline reads it at {vae[0]}x")
        assert note.endswith(f"and its text encoder at {encoder[0]}x{encoder[1]}")


@pytest.mark.parametrize("size", SIZES)
def test_flux2_scales_an_image_over_1_mp_as_diffusers_does_then_crops_to_its_multiple(size):
    assert FLUX2 is not None and FLUX2.multiple == 16
    scaled = Flux2ImageProcessor._resize_if_exceeds_area(Image.new("RGB", size), FLUX2.area).size
    assert FLUX2.size(*size) == (scaled[0] // 16 * 16, scaled[1] // 16 * 16)


def test_the_warnings_name_each_changed_image_in_the_prompts_numbering():
    first, square, wide = input_image(64, 64), input_image(64, 64, 1), input_image(2048, 1536, 2)
    notes = reference_notes(first, [square, wide], FLUX2)
    assert notes == (
        "image 3 (images[1]) is 2048x1536: the pipeline reads it at 1168x880 (scaled to within 1048576 pixels, "
        "then center-cropped to sides in multiples of 16)",
    )
    assert reference_notes(first, [square], FLUX2) == () and reference_notes(first, [wide], None) == ()
    # klein's inpainting reads every reference at the first one's size, and the repainted image is no reference.
    (inpainting,) = reference_notes(first, [square, wide], FLUX2, inpainting=True)
    assert inpainting.startswith("image 3 (images[1]) is 2048x1536: the pipeline reads it at 64x64 (resized")


def test_what_flux2s_call_would_refuse_is_refused_first_naming_the_image():
    assert FLUX2 is not None and (FLUX2.min_side, FLUX2.max_ratio) == (64, 8)
    with pytest.raises(InvalidRequestError, match=r"image 2 \(images\[0\]\) is 63x64, under this pool's 64 px"):
        check_reference_sizes(input_image(), [input_image(63, 64)], FLUX2)
    with pytest.raises(InvalidRequestError, match=r"image 1 \(the image\) is 1040x128, an aspect ratio over .* 8:1"):
        check_reference_sizes(input_image(1040, 128), [], FLUX2)
    check_reference_sizes(input_image(1024, 128), [input_image(64, 512)], FLUX2)  # 8:1 is taken


def test_normalise_says_and_checks_what_the_pools_pipeline_does_with_its_references():
    defaults = ModelDefaults(
        steps=4, guidance=1.0, side=64, max_side=256, side_multiple=16,
        modes=("text-to-image", "image-to-image", "inpainting"), max_reference_images=4, inpaint_references=True,
        reference_fit=FLUX2,
    )  # fmt: skip
    limits = Limits(max_loras=4, max_steps=50, max_prompt_chars=200)
    request = GenerateRequest(prompt="image 1 and image 2", image=input_image(), images=(input_image(72, 64, 1),))
    checked = normalise_request(request, defaults, limits)
    assert checked.notes == ("image 2 (images[0]) is 72x64: the pipeline reads it at 64x64 (center-cropped to sides "
                             "in multiples of 16)",)  # fmt: skip
    assert defaults.ignored(checked) == checked.notes
    with pytest.raises(InvalidRequestError, match=r"image 2 \(images\[0\]\) is 72x32, under this pool's 64 px") as e:
        normalise_request(GenerateRequest(prompt="x", image=input_image(), images=(input_image(72, 32),)), defaults,
                          limits)  # fmt: skip
    assert e.value.status == 400
    # Inpainting: the image is repainted, not read as a reference; klein's call checks no reference.
    masked = GenerateRequest(prompt="x", image=input_image(), mask_image=input_mask(), images=(input_image(72, 32),))
    assert normalise_request(masked, defaults, limits).mode == "inpainting"
