"""FLUX.2 [klein] and [dev] edit from reference images through their own pools: the request's image and its
further `images` go to diffusers' own `image=[...]` (klein's inpainting: `image_reference=[...]`). With 1 and 2
references and a LoRA, each equals diffusers' pipeline with load_lora_weights + fuse_lora within 2 levels; each
pool says its limit (BFL's: klein 4, [dev] 6) and refuses more, naming it; the base stays bit-exact after edits
and refusals. The tiny FLUX.2 pipelines barely read their references (their 512 padded text tokens outweigh a 64 px
reference's 16 in attention: adding or swapping one moves the image by 1 level at most, a 256 px one by 3), so the
order's effect is shown on the tiny Qwen-Image-Edit-2509/2511 (test_qwen_image_edit_plus.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import Flux2KleinInpaintPipeline, Flux2KleinPipeline, Flux2Pipeline
from PIL import Image

from engine.errors import InvalidRequestError, LimitExceededError
from engine.pipeline.loading import load_pipeline
from engine.requests import GenerateRequest, InputImage, LoraSpec
from families.flux2 import MODEL_ID as KLEIN
from families.flux2_dev import MODEL_ID as DEV
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, local_engine, pixels
from tests.support.flux2 import CASES, write_flux2_loras
from tests.support.image_inputs import PROMPT, example_image, example_mask, input_image, input_mask
from tests.support.images import assert_images_close, level_difference

LORA = CASES[0]
COMPONENTS = ("transformer", "text_encoder", "vae")
# Three images of their own (other seeds, other sizes: FLUX.2 reads each reference at its own size).
REFERENCE_SIZES = ((64, 64, 0), (80, 64, 1), (64, 96, 2))


def reference(index: int) -> Image.Image:
    width, height, seed = REFERENCE_SIZES[index]
    return example_image(width, height, seed)


@pytest.fixture(scope="module")
def tiny_dev_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.families.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(tmp_path_factory.mktemp("tiny-flux2-dev") / "pipeline", model_id="tiny-flux2-dev")


@pytest.fixture(scope="module")
def loaded_dev(tiny_dev_dir: Path, base_settings):
    return load_pipeline(base_settings.replace(model_id=str(tiny_dev_dir), base_model_id=DEV))


@pytest.fixture(scope="module", params=["klein", "dev"])
def pool(request, loaded_flux2, tiny_flux2_dir, base_settings, tmp_path_factory) -> Any:
    """(engine, the diffusers class, its tiny folder, the LoRA folder, the guidance its defaults run, the pipeline's
    pristine weights) per pool."""
    if request.param == "klein":
        loaded, tiny_dir, cls, base, guidance = loaded_flux2, tiny_flux2_dir, Flux2KleinPipeline, KLEIN, 1.0
    else:
        loaded, tiny_dir = request.getfixturevalue("loaded_dev"), request.getfixturevalue("tiny_dev_dir")
        cls, base, guidance = Flux2Pipeline, DEV, 4.0
    folder = tmp_path_factory.mktemp(f"references-{request.param}")
    write_flux2_loras(loaded.pipe, folder, cases=[LORA])
    settings = base_settings.replace(local_lora_dir=folder, base_model_id=base)
    # Taken before this module's engine swaps anything (each engine restores the base when it closes).
    pristine = {
        f"{n}.{k}": v.detach().clone() for n in COMPONENTS for k, v in getattr(loaded.pipe, n).state_dict().items()
    }
    with local_engine(loaded, settings, folder) as engine:
        yield engine, cls, tiny_dir, folder, guidance, pristine


def edit(count: int, *, lora: bool = True, order: tuple[int, ...] | None = None, **fields: Any) -> GenerateRequest:
    """An edit from the first image and `count` further references (in `order`), 3 steps at 64 px, seed 7."""
    picked = order if order is not None else tuple(range(1, count + 1))
    request: dict[str, Any] = {
        "prompt": PROMPT,
        "loras": (LoraSpec(f"local:{LORA.file_name}", scale=0.8),) if lora else (),
        "steps": 3,
        "width": 64,
        "height": 64,
        "seed": 7,
        "image": input_image(),
        "images": tuple(input_image(*REFERENCE_SIZES[i]) for i in picked),
    }
    return GenerateRequest(**(request | fields))


def diffusers_edit(cls: Any, tiny_dir: Path, folder: Path, count: int, guidance: float, **call: Any) -> Image.Image:
    """diffusers' own edit: the pipeline from its folder, the LoRA loaded and fused at 0.8, `image=[...]`."""
    pipe: Any = cls.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(folder), weight_name=LORA.reference_name, adapter_name="a0")
    pipe.fuse_lora(components=["transformer"], lora_scale=0.8)
    generator = torch.Generator("cpu").manual_seed(7)
    arguments = {"image": [example_image(), *(reference(i) for i in range(1, count + 1))]} | call
    return pipe(
        prompt=PROMPT,
        num_inference_steps=3,
        guidance_scale=guidance,
        width=64,
        height=64,
        generator=generator,
        **arguments,
    ).images[0]


@pytest.mark.parametrize("count", [0, 1, 2])
def test_an_edit_from_references_with_a_lora_equals_diffusers_own(pool, count):
    engine, cls, tiny_dir, folder, guidance, _ = pool
    ours = generate(engine, edit(count))
    assert ours.request.mode == "image-to-image" and len(ours.request.images) == count
    assert_images_close(pixels(ours.image), pixels(diffusers_edit(cls, tiny_dir, folder, count, guidance)))
    plain = generate(engine, edit(count, lora=False))
    assert level_difference(plain.image, ours.image) > 2, "the LoRA must visibly change the edit"


def test_klein_inpaints_with_references_as_diffusers_own(pool, loaded_flux2):
    engine, cls, tiny_dir, folder, guidance, _ = pool
    if cls is not Flux2KleinPipeline:
        pytest.skip("only klein has an inpainting class")
    ours = generate(engine, edit(1, mask_image=input_mask(), strength=0.8))
    assert ours.request.mode == "inpainting"
    pipe: Any = Flux2KleinPipeline.from_pretrained(tiny_dir)
    pipe.load_lora_weights(str(folder), weight_name=LORA.reference_name, adapter_name="a0")
    pipe.fuse_lora(components=["transformer"], lora_scale=0.8)
    inpaint: Any = Flux2KleinInpaintPipeline.from_pipe(pipe)
    inpaint.set_progress_bar_config(disable=True)
    expected = inpaint(
        prompt=PROMPT,
        image=example_image(),
        mask_image=example_mask(),
        image_reference=[reference(1)],
        strength=0.8,
        num_inference_steps=3,
        guidance_scale=guidance,
        width=64,
        height=64,
        generator=torch.Generator("cpu").manual_seed(7),
    ).images[0]
    assert_images_close(pixels(ours.image), pixels(expected))


def test_each_pool_says_its_limit_and_refuses_more_naming_it(pool):
    engine, cls = pool[0], pool[1]
    limit = 4 if cls is Flux2KleinPipeline else 6
    assert engine.defaults.max_reference_images == limit
    too_many = edit(0, images=(input_image(),) * limit)
    with pytest.raises(LimitExceededError, match=rf"{limit + 1} images were given .* takes at most {limit}") as e:
        generate(engine, too_many)
    assert e.value.status == 400


def test_the_base_is_bit_exact_after_edits_and_refusals(pool):
    engine, pristine = pool[0], pool[-1]
    pipe = engine.loaded.pipe
    base = generate(engine, edit(1, lora=False)).image.tobytes()
    generate(engine, edit(2))
    refusals = (
        edit(0, images=(input_image(),) * 6, lora=True),
        edit(1, image=None),
        edit(1, images=("not an image",)),  # type: ignore[arg-type]
    )
    for bad in refusals:
        with pytest.raises(InvalidRequestError):
            generate(engine, bad)
    engine.restore_base_weights()
    assert_components_pristine(pipe, pristine, COMPONENTS)
    assert generate(engine, edit(1, lora=False)).image.tobytes() == base


def test_a_non_square_image_1_goes_to_diffusers_at_its_own_aspect_and_the_warning_names_its_size(pool):
    """Image 1 is a reference here, not a canvas: the pool passes it as sent (70 x 66 for a 64 x 64 output), as
    diffusers' own call takes it, and says what the pipeline reads it at (cropped to its multiple of 4)."""
    engine, cls, tiny_dir, _, guidance, _ = pool
    first = example_image(70, 66, 0)
    ours = generate(engine, edit(1, lora=False, image=InputImage.from_pil(first)))
    assert (ours.request.width, ours.request.height, ours.request.image.size) == (64, 64, (70, 66))
    assert (
        "image 1 (the image) is 70x66: the pipeline reads it at 68x64 (center-cropped to sides in multiples of 4)"
        in (ours.warnings)
    )
    pipe: Any = cls.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(
        prompt=PROMPT,
        image=[first, reference(1)],
        num_inference_steps=3,
        guidance_scale=guidance,
        width=64,
        height=64,
        generator=torch.Generator("cpu").manual_seed(7),
    ).images[0]
    assert pixels(ours.image).tobytes() == pixels(theirs).tobytes()
