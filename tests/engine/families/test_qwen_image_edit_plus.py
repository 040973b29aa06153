"""Qwen-Image-Edit-2509 and -2511 as a pool (`QwenImageEditPlusPipeline`): 1, 2 and 3 reference images on the tiny
EditPlus against diffusers' own QwenImageEditPlusPipeline with the LoRA fused (every Qwen-Image LoRA naming and the
bit-exact base are the shared tests/engine/families/test_swaps.py's); more than 3, a mask, or no image refused
naming what is accepted; its LoRAs routed to it by what they declare (both bases, musubi-tuner's metadata);
lightx2v's edit Lightning LoRAs recognised. Everything the family needs is engine/families/qwen_image_edit_plus.py
(and families/qwen_image_edit_plus.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
    CONDITION_IMAGE_SIZE,
    VAE_IMAGE_SIZE,
    calculate_dimensions,
)
from PIL import Image

from engine.errors import IncompatibleLoraError, InvalidRequestError, LimitExceededError, SettingsError
from engine.families import qwen_image, qwen_image_edit
from engine.families.origin import judge_origin
from engine.families.qwen_image_edit_plus import FAMILY
from engine.families.registry import family_spec
from engine.pools.routing import pick_pool
from engine.requests import GenerateRequest, InputImage, LoraSpec
from families.qwen_image_edit_plus import MODEL_ID, MODEL_ID_2511
from lora_catalog.entries import Family
from lora_catalog.hints import speed_hints
from tests.support.checks import generate
from tests.support.dit import local_engine, pixels, served_pools
from tests.support.image_inputs import PROMPT, example_image, input_image, input_mask
from tests.support.images import assert_images_close, level_difference
from tests.support.qwen_image import CASES, write_qwen_loras

# musubi-tuner's ModelSpec architecture for a Qwen-Image-Edit-2509 LoRA (its utils/sai_model_spec.py).
PLUS_METADATA = {"modelspec.architecture": "Qwen-Image-Edit-Plus/lora"}
# The further references: other seeds and shapes (the pipeline reads each at its own aspect ratio).
REFERENCES = ((64, 64, 1), (96, 64, 2), (64, 80, 3))


@pytest.fixture(scope="module")
def tiny_plus_dir(tiny_qwen_image_edit_plus_dir: Path) -> Path:
    return tiny_qwen_image_edit_plus_dir


@pytest.fixture(scope="module")
def loaded_plus(loaded_qwen_image_edit_plus):
    return loaded_qwen_image_edit_plus


@pytest.fixture(scope="module")
def plus_loras(loaded_plus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every Qwen-Image naming made for the tiny transformer, declaring Qwen-Image-Edit-Plus in its metadata."""
    folder = tmp_path_factory.mktemp("qwen-edit-plus-loras")
    write_qwen_loras(loaded_plus.pipe, folder, metadata=PLUS_METADATA)
    return folder


@pytest.fixture(scope="module")
def plus_engine(loaded_plus, pristine_qwen_image_edit_plus, base_settings, plus_loras):
    settings = base_settings.replace(local_lora_dir=plus_loras, base_model_id=MODEL_ID)
    with local_engine(loaded_plus, settings, plus_loras) as engine:
        yield engine


def edit(*loras: LoraSpec, references: tuple[int, ...] = (), **fields: Any) -> GenerateRequest:
    """Two steps without true CFG (one transformer pass a step) at the first image's 64 px, seed 7, with the
    further references `references` (indices into REFERENCES, in that order)."""
    request = {
        "prompt": PROMPT,
        "loras": loras,
        "steps": 2,
        "guidance": 1.0,
        "seed": 7,
        "image": input_image(),
        "images": tuple(input_image(*REFERENCES[i]) for i in references),
    }
    return GenerateRequest(**(request | fields))  # type: ignore[arg-type]


def diffusers_edit(tiny_dir: Path, folder: Path, weight_name: str | None, references: tuple[int, ...]) -> Image.Image:
    """diffusers' own edit: QwenImageEditPlusPipeline from the folder, the LoRA loaded and fused into the
    transformer (at 0.8), called with `image=[the first, *references]` as `edit()` asks."""
    pipe: Any = QwenImageEditPlusPipeline.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    if weight_name is not None:
        pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
        pipe.fuse_lora(components=["transformer"], lora_scale=0.8)
    images = [example_image(), *(example_image(*REFERENCES[i]) for i in references)]
    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(
        prompt=PROMPT,
        image=images,
        generator=generator,
        num_inference_steps=2,
        true_cfg_scale=1.0,
        width=64,
        height=64,
    ).images[0]


# -- the family ----------------------------------------------------------------------------------------------


def test_the_tiny_edit_plus_is_a_reference_editing_pool_of_qwen_images_structure(loaded_plus):
    pipe = loaded_plus.pipe
    assert type(pipe) is QwenImageEditPlusPipeline and loaded_plus.family is FAMILY
    assert family_spec(MODEL_ID) is FAMILY and family_spec(MODEL_ID_2511) is FAMILY
    assert family_spec("Qwen/Qwen-Image-Edit") is qwen_image_edit.FAMILY
    defaults = loaded_plus.defaults
    assert defaults.needs_image and defaults.modes == ("image-to-image",)
    assert (defaults.max_reference_images, defaults.inpaint_references) == (3, False)
    assert (defaults.guidance, defaults.guidance_kind, defaults.side_multiple) == (4.0, "cfg", 16)
    assert FAMILY.defaults(pipe).steps == 40  # Qwen's card (the tiny pool runs 4)
    # Qwen-Image's LoRA converter, widths and memory: the same transformer.
    assert FAMILY.convert_lora is qwen_image.convert_lora and FAMILY.memory is qwen_image.MEMORY
    # A width of its own among the tiny pipelines (the tiny Qwen-Image-Edit's is 96).
    assert FAMILY.signature.pipeline_widths(pipe.transformer, {}).denoiser == {112}


def test_a_plus_checkpoint_loads_its_processor_and_an_edit_one_is_refused_naming_its_base(loaded_plus, tmp_path):
    pipe = loaded_plus.pipe
    folder = tmp_path / "processor"
    pipe.processor.image_processor.save_pretrained(folder)
    pipe.tokenizer.save_pretrained(folder)
    (tmp_path / "model_index.json").write_text('{"_class_name": "QwenImageEditPlusPipeline"}')
    loaded = FAMILY.load_components(str(tmp_path), None)["processor"]  # type: ignore[misc]
    assert type(loaded) is qwen_image_edit.ImageQwen2VLProcessor
    with pytest.raises(SettingsError, match=r"QwenImageEditPlusPipeline checkpoint is served as BASE=Qwen/Qwen-Im"):
        qwen_image_edit.FAMILY.load_components(str(tmp_path), None)  # type: ignore[misc]
    (tmp_path / "model_index.json").write_text('{"_class_name": "QwenImageEditPipeline"}')
    with pytest.raises(
        SettingsError, match=r"accepted: a QwenImageEditPlusPipeline checkpoint .*BASE=Qwen/Qwen-Image-E"
    ):
        FAMILY.load_components(str(tmp_path), None)  # type: ignore[misc]


# -- against diffusers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("references", [(), (0,), (0, 1)], ids=["1 image", "2 images", "3 images"])
def test_one_two_and_three_images_with_a_lora_equal_diffusers_own(plus_engine, plus_loras, tiny_plus_dir, references):
    lora = LoraSpec(f"local:{CASES[0].file_name}", scale=0.8)
    ours = generate(plus_engine, edit(lora, references=references))
    assert len(ours.request.images) == len(references)
    reference = diffusers_edit(tiny_plus_dir, plus_loras, CASES[0].reference_name, references)
    assert_images_close(pixels(ours.image), pixels(reference))
    if not references:
        plain = generate(plus_engine, edit())
        assert level_difference(plain.image, ours.image) > 2, "the LoRA must visibly change the edit"


def test_the_2511_base_runs_the_same_edit(loaded_plus, base_settings, plus_loras, plus_engine):
    """Qwen-Image-Edit-2511 is served by the same family (its own base id): the same request, the same image."""
    settings = base_settings.replace(local_lora_dir=plus_loras, base_model_id=MODEL_ID_2511)
    request = edit(LoraSpec(f"local:{CASES[1].file_name}", scale=0.8))
    first = generate(plus_engine, request).image
    plus_engine.restore_base_weights()
    with local_engine(loaded_plus, settings, plus_loras) as engine:
        assert engine.defaults.max_reference_images == 3
        assert_images_close(pixels(generate(engine, request).image), pixels(first))


# -- bad input --------------------------------------------------------------------------------------------------


def test_more_than_three_images_are_refused_naming_the_limit(plus_engine):
    with pytest.raises(LimitExceededError, match=r"4 images were given .* this pool's model takes at most 3") as e:
        generate(plus_engine, edit(references=(0, 1, 2)))
    assert e.value.status == 400


def test_a_mask_and_a_request_without_an_image_are_refused(plus_engine):
    with pytest.raises(InvalidRequestError, match=r"mask_image was given with images .* takes one image") as e:
        generate(plus_engine, edit(references=(0,), mask_image=input_mask(), strength=0.8))
    assert e.value.status == 400
    with pytest.raises(InvalidRequestError, match="no inpainting pipeline; accepted: image-to-image"):
        generate(plus_engine, edit(mask_image=input_mask(), strength=0.8))
    with pytest.raises(InvalidRequestError, match=r"images .* were given without the first image"):
        generate(plus_engine, edit(references=(0,), image=None))


# -- routing and speed LoRAs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bases", "metadata"),
    [
        ([MODEL_ID], {}),
        ([MODEL_ID_2511], {}),
        ([], PLUS_METADATA),
        ([], {"modelspec.architecture": "Qwen-Image-Edit-2511/lora"}),
        ([], {"ss_sd_model_name": "qwen_image_edit_2509_bf16.safetensors"}),
    ],
)
def test_edit_plus_loras_route_to_the_edit_plus_pool(tiny_pipes, bases, metadata):
    pools = served_pools(tiny_pipes)
    origin = judge_origin(bases, lambda: (metadata, {}))
    assert origin.families == (Family.QWEN_IMAGE_EDIT_PLUS,)
    assert pools[pick_pool("LoRA 'x'", origin, pools)].family is Family.QWEN_IMAGE_EDIT_PLUS


@pytest.mark.parametrize(
    ("names", "repo", "steps"),
    [
        (["Qwen-Image-Edit-2509/Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors"], None, 4),
        (["Qwen-Image-Edit-2509-Lightning-8steps-V1.0-fp32.safetensors"], None, 8),
        (["Qwen-Image-Edit-2511-Lightning-4steps-V1.0-bf16.safetensors"], None, 4),
        (["Qwen-Image-Edit-2511-Lightning-8steps-V1.0-bf16.safetensors"], "lightx2v/Qwen-Image-Edit-2511-Lightning", 8),
    ],
)
def test_lightx2vs_edit_lightning_loras_get_qwen_image_lightnings_settings(names, repo, steps):
    hints = speed_hints(names, repo_id=repo)
    assert (hints.speed, hints.sampler, hints.steps, hints.guidance) == (
        "Qwen-Image-Lightning",
        "Euler flow",
        steps,
        1.0,
    )


# -- exactness ----------------------------------------------------------------------------------------------------


def test_a_plus_lora_runs_on_the_edit_pool_only_where_no_plus_pool_is_served_with_a_warning(tiny_pipes):
    from engine.families.origin import check_origin
    from families.qwen_image_edit import MODEL_ID as EDIT

    origin = judge_origin([MODEL_ID_2511], lambda: pytest.fail("the card decides"))
    every = served_pools(tiny_pipes)
    assert every[pick_pool("LoRA 'x'", origin, every)].family is Family.QWEN_IMAGE_EDIT_PLUS
    without = [p for p in every if p.family is not Family.QWEN_IMAGE_EDIT_PLUS]
    assert without[pick_pool("LoRA 'x'", origin, without)].family is Family.QWEN_IMAGE_EDIT
    warning = check_origin("LoRA 'x'", origin, EDIT)
    assert (
        warning is not None and "made for Qwen/Qwen-Image-Edit-2511, which no pool here serves; it runs on" in warning
    )
    metadata = judge_origin([], lambda: (PLUS_METADATA, {}))
    assert check_origin("LoRA 'x'", metadata, EDIT) is not None
    # Never the other way, nor onto Qwen-Image's pool.
    with pytest.raises(IncompatibleLoraError):
        check_origin("LoRA 'x'", judge_origin([EDIT], lambda: ({}, {})), MODEL_ID)
    with pytest.raises(IncompatibleLoraError):
        check_origin("LoRA 'x'", origin, "Qwen/Qwen-Image")


def test_a_non_square_image_1_goes_to_diffusers_at_its_own_aspect_and_the_warning_names_its_size(
    plus_engine, tiny_plus_dir
):
    """Image 1 is a reference here: passed as sent (96 x 64 for a 64 x 64 output, never stretched to it), as
    diffusers' own call takes it; the warning names the sent size and diffusers' own sizing of it."""
    first = example_image(96, 64, 0)
    ours = generate(plus_engine, edit(image=InputImage.from_pil(first), width=64, height=64))
    assert (ours.request.width, ours.request.height, ours.request.image.size) == (64, 64, (96, 64))
    vae = calculate_dimensions(VAE_IMAGE_SIZE, 96 / 64)
    encoder = calculate_dimensions(CONDITION_IMAGE_SIZE, 96 / 64)
    said = [warning for warning in ours.warnings if warning.startswith("image 1 (the image)")]
    assert said == [
        f"image 1 (the image) is 96x64: the pipeline reads it at {vae[0]}x{vae[1]} (scaled to about "
        f"{VAE_IMAGE_SIZE} pixels, sides in multiples of 32), and its text encoder at {encoder[0]}x{encoder[1]}"
    ]
    pipe: Any = QwenImageEditPlusPipeline.from_pretrained(tiny_plus_dir)
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(
        prompt=PROMPT,
        image=[first],
        generator=torch.Generator("cpu").manual_seed(7),
        num_inference_steps=2,
        true_cfg_scale=1.0,
        width=64,
        height=64,
    ).images[0]
    assert pixels(ours.image).tobytes() == pixels(theirs).tobytes()
