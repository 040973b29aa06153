"""Qwen-Image-Edit as a pool: every Qwen-Image LoRA naming on the tiny Qwen-Image-Edit against diffusers' own
QwenImageEditPipeline with the LoRA fused (and inpainting against QwenImageEditInpaintPipeline); no request
without an image, with or without an edit LoRA; its LoRAs routed to it by what they declare (card base,
metadata), those declaring nothing to the Qwen-Image pool; the base bit-exact after swaps and refusals.
Everything the family needs is engine/families/qwen_image_edit.py (and families/qwen_image_edit.py).
Its namings against diffusers' fuse and its base bit-exact after swaps: test_swaps.py (tests/support/swaps.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import QwenImageEditInpaintPipeline, QwenImageEditPipeline
from PIL import Image

from engine.errors import IncompatibleLoraError, InvalidRequestError, SettingsError
from engine.families import qwen_image
from engine.families.origin import judge_origin
from engine.families.qwen_image_edit import FAMILY, ImageQwen2VLProcessor
from engine.families.registry import family_spec
from engine.pools.routing import pick_pool
from engine.requests import GenerateRequest, LoraSpec
from families.qwen_image import MODEL_ID as QWEN_IMAGE_ID
from families.qwen_image_edit import MODEL_ID
from lora_catalog.bases import family_from_metadata
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import hub_pools, pixels, served_pools
from tests.support.image_inputs import PROMPT, example_image, example_mask, input_image, input_mask
from tests.support.images import assert_images_close
from tests.support.qwen_image import CASES, MODULES, factors, lora_file, write_qwen_loras

# musubi-tuner's ModelSpec architecture for a Qwen-Image-Edit LoRA (its utils/sai_model_spec.py).
EDIT_METADATA = {"modelspec.architecture": "Qwen-Image-Edit/lora"}


@pytest.fixture(scope="module")
def edit_loras(loaded_qwen_image_edit, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every Qwen-Image naming made for the tiny edit transformer, declaring Qwen-Image-Edit in its metadata;
    one made for a wider transformer (64 wide, where the tiny edit one is 96); one declaring nothing."""
    folder = tmp_path_factory.mktemp("qwen-edit-loras")
    write_qwen_loras(loaded_qwen_image_edit.pipe, folder, metadata=EDIT_METADATA)
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in MODULES[:2]}
    save_lora(folder / "edit_wide.safetensors", lora_file(wide, "peft", None), EDIT_METADATA)
    # The same namings with no metadata: judged by names alone, a Qwen-Image LoRA.
    save_lora(
        folder / "edit_plain.safetensors",
        lora_file(factors(loaded_qwen_image_edit.pipe.transformer, seed=9), "peft", None),
    )
    return folder


@pytest.fixture
def edit_engine(family_engine, edit_loras):
    return family_engine(Family.QWEN_IMAGE_EDIT, edit_loras)


def edit(*loras: LoraSpec, **fields: Any) -> GenerateRequest:
    """Two steps without true CFG (one transformer pass a step) at the image's 64 px, seed 7."""
    request = {"prompt": PROMPT, "loras": loras, "steps": 2, "guidance": 1.0, "seed": 7, "image": input_image()}
    return GenerateRequest(**(request | fields))  # type: ignore[arg-type]


def diffusers_edit(tiny_dir: Path, folder: Path, weight_name: str | None, mode: Any = None, **call: Any) -> Image.Image:
    """diffusers' own edit: QwenImageEditPipeline from the folder, the LoRA loaded and fused into the transformer
    (at 0.8), then `mode.from_pipe` of it where given, called as `edit()` asks."""
    pipe: Any = QwenImageEditPipeline.from_pretrained(tiny_dir)
    if weight_name is not None:
        pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
        pipe.fuse_lora(components=["transformer"], lora_scale=0.8)
    if mode is not None:
        pipe = mode.from_pipe(pipe)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator("cpu").manual_seed(7)
    arguments = {"num_inference_steps": 2, "true_cfg_scale": 1.0, "width": 64, "height": 64} | call
    return pipe(prompt=PROMPT, image=example_image(), generator=generator, **arguments).images[0]


# -- the family --------------------------------------------------------------------------------------------


def test_the_tiny_qwen_image_edit_is_an_editing_pool_of_qwen_images_structure(loaded_qwen_image_edit):
    pipe = loaded_qwen_image_edit.pipe
    assert (
        type(pipe) is QwenImageEditPipeline
        and loaded_qwen_image_edit.family is FAMILY
        and family_spec(MODEL_ID) is FAMILY
    )
    # Qwen's later edit releases are their own family (QwenImageEditPlusPipeline): test_qwen_image_edit_plus.py.
    assert family_spec("Qwen/Qwen-Image-Edit-2509") is not FAMILY
    defaults = loaded_qwen_image_edit.defaults
    assert defaults.needs_image and defaults.modes == ("image-to-image", "inpainting")
    assert defaults.strength is None and defaults.inpaint_strength == 0.6  # diffusers' edit-inpaint default
    assert (defaults.guidance, defaults.guidance_kind, defaults.side_multiple) == (4.0, "cfg", 16)
    # Qwen-Image's LoRA converter, widths and memory: the same transformer.
    assert FAMILY.convert_lora is qwen_image.convert_lora and FAMILY.memory is qwen_image.MEMORY
    assert FAMILY.signature.pipeline_widths(pipe.transformer, {}).denoiser == {96}
    # The processor declares no video processor (transformers would build it with torchvision).
    assert type(pipe.processor) is ImageQwen2VLProcessor and not hasattr(pipe.processor, "video_processor")
    system_turn = pipe.prompt_template_encode.split("<|vision_start|>")[0]
    assert (len(pipe.tokenizer(system_turn).input_ids), pipe.prompt_template_encode_start_idx) == (169, 64)
    # diffusers hands it the ~1 MP conditioning image: the tiny processor scales it to 112 px, 8 x 8 patches.
    inputs = pipe.processor(text=["<|vision_start|><|image_pad|><|vision_end|>a fox"], images=example_image(1024, 1024))
    vision = pipe.text_encoder.config.vision_config
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    assert inputs["pixel_values"].shape[-1] == patch and inputs["image_grid_thw"].tolist() == [[1, 8, 8]]


def test_the_processor_loads_from_a_checkpoint_laid_out_as_qwens(loaded_qwen_image_edit, tmp_path):
    """Qwen/Qwen-Image-Edit's processor/ holds the image processor's preprocessor_config.json, the tokenizer and a
    video_preprocessor_config.json: the image and text parts load, the video one is never read."""
    pipe = loaded_qwen_image_edit.pipe
    folder = tmp_path / "processor"
    pipe.processor.image_processor.save_pretrained(folder)
    pipe.tokenizer.save_pretrained(folder)
    (folder / "video_preprocessor_config.json").write_text('{"video_processor_type": "Qwen2VLVideoProcessor"}')
    (tmp_path / "model_index.json").write_text('{"_class_name": "QwenImageEditPipeline"}')
    loaded = FAMILY.load_components(str(tmp_path), None)["processor"]  # type: ignore[misc]
    assert type(loaded) is ImageQwen2VLProcessor and not hasattr(loaded, "video_processor")
    assert loaded.image_processor.size == pipe.processor.image_processor.size
    assert loaded.tokenizer("a fox").input_ids == pipe.tokenizer("a fox").input_ids


def test_a_checkpoint_for_the_plus_pipeline_is_refused_naming_what_is_accepted(tmp_path):
    """Qwen-Image-Edit-2509's model_index.json names QwenImageEditPlusPipeline: its own family serves it."""
    (tmp_path / "model_index.json").write_text('{"_class_name": "QwenImageEditPlusPipeline"}')
    with pytest.raises(SettingsError, match=r"is a QwenImageEditPlusPipeline checkpoint, which this pool does not run"):
        FAMILY.load_components(str(tmp_path), None)  # type: ignore[misc]


# -- every naming, against diffusers ----------------------------------------------------------------------------


def test_edit_inpainting_equals_diffusers_own(edit_engine, edit_loras, tiny_qwen_image_edit_dir):
    lora = LoraSpec(f"local:{CASES[0].file_name}", scale=0.8)
    ours = generate(edit_engine, edit(lora, mask_image=input_mask(), strength=0.8))
    assert ours.request.mode == "inpainting"
    reference = diffusers_edit(
        tiny_qwen_image_edit_dir,
        edit_loras,
        CASES[0].reference_name,
        QwenImageEditInpaintPipeline,
        mask_image=example_mask(),
        strength=0.8,
    )
    assert_images_close(pixels(ours.image), pixels(reference))


# -- bad input --------------------------------------------------------------------------------------------------


def test_a_text_to_image_request_is_refused_saying_it_needs_an_image(edit_engine):
    text = GenerateRequest(prompt="a fox", steps=2, width=64, height=64)
    with pytest.raises(InvalidRequestError, match="edits an image: a text-to-image request needs one; accepted") as e:
        generate(edit_engine, text)
    assert e.value.status == 400


def test_an_edit_lora_without_an_image_is_refused_naming_the_image(
    hub, loaded_qwen_image, loaded_qwen_image_edit, base_settings, edit_loras
):
    """Beside a Qwen-Image pool: the edit LoRA (its metadata says Qwen-Image-Edit) routes to the edit pool, which
    refuses a request without an image, saying it needs one."""
    pipelines = [(loaded_qwen_image, QWEN_IMAGE_ID), (loaded_qwen_image_edit, MODEL_ID)]
    lora = LoraSpec(f"local:{CASES[0].file_name}")
    request = GenerateRequest(prompt="a fox", loras=(lora,), steps=2, guidance=1.0, seed=7)
    with hub_pools(pipelines, base_settings, hub.url, edit_loras) as pools:
        assert pools.route(request).pool.base_model_id == MODEL_ID
        with pytest.raises(InvalidRequestError, match=r"edits an image: a text-to-image request needs one") as e:
            generate(pools, request)
        assert e.value.status == 400
        # The same LoRA with an image runs there.
        assert generate(pools, edit(lora)).request.mode == "image-to-image"


def test_checking_and_prefetching_a_lora_on_the_edit_pool_needs_no_image(edit_engine):
    """The UI's LoRA check and a gallery prefetch prepare a LoRA with no request image (an editing pool refused
    them as text-to-image requests)."""
    spec = LoraSpec(f"local:{CASES[1].file_name}")
    assert edit_engine.check_lora(spec).components == ("transformer",)
    assert edit_engine.prefetch(LoraSpec(f"local:{CASES[2].file_name}")).result(timeout=120) is None


def test_a_lora_for_a_wider_transformer_is_refused_naming_the_layer(edit_engine):
    with pytest.raises(IncompatibleLoraError, match=r"do not fit transformer\.transformer_blocks\.0") as e:
        edit_engine.check_lora(LoraSpec("local:edit_wide.safetensors"))
    assert e.value.status == 400


# -- routing ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bases", "metadata"),
    [
        ([MODEL_ID], {}),
        ([], {"modelspec.architecture": "Qwen-Image-Edit/lora"}),
        ([], {"ss_sd_model_name": "qwen_image_edit_bf16.safetensors"}),
    ],
)
def test_qwen_image_edit_loras_route_to_the_edit_pool(tiny_pipes, bases, metadata):
    pools = served_pools(tiny_pipes)
    origin = judge_origin(bases, lambda: (metadata, {}))
    assert origin.families == (Family.QWEN_IMAGE_EDIT,)
    assert pools[pick_pool("LoRA 'x'", origin, pools)].family is Family.QWEN_IMAGE_EDIT


def test_a_qwen_lora_declaring_nothing_or_qwen_image_routes_to_the_generation_pool(tiny_pipes):
    """Names alone cannot tell an edit LoRA from a generation one (the same transformer): such a LoRA is judged a
    Qwen-Image one, as Qwen-Image's card, metadata and Civitai's one "Qwen" label declare."""
    from lora_catalog.civitai.bases import civitai_base

    pools = served_pools(tiny_pipes)
    shapes = {
        k: tuple(v.shape)
        for k, v in lora_file(factors(tiny_pipes[Family.QWEN_IMAGE].transformer), "peft", None).items()
    }
    for origin in (
        judge_origin([], lambda: ({}, shapes)),
        judge_origin([QWEN_IMAGE_ID], lambda: pytest.fail("the card decides")),
        judge_origin([], lambda: ({"modelspec.architecture": "Qwen-Image/lora"}, {})),
    ):
        assert origin.families == (Family.QWEN_IMAGE,)
        assert pools[pick_pool("LoRA 'x'", origin, pools)].family is Family.QWEN_IMAGE
    assert family_from_metadata({"modelspec.architecture": "Qwen-Image-Edit/lora"}) is Family.QWEN_IMAGE_EDIT
    found = civitai_base("Qwen")
    assert found is not None and found.family is Family.QWEN_IMAGE


def test_a_lora_declaring_nothing_is_refused_on_an_edit_pool_naming_qwen_image(edit_engine):
    """As a FLUX.1 LoRA on a Kontext pool: its names read as Qwen-Image's, and nothing says it is an edit LoRA."""
    with pytest.raises(IncompatibleLoraError, match="trained for the qwen_image family") as e:
        edit_engine.check_lora(LoraSpec("local:edit_plain.safetensors"))
    assert e.value.status == 400
