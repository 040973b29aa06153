"""Qwen-Image on the tiny Qwen-Image pipeline: every LoRA naming diffusers' loader reads, against its
load_lora_weights + fuse_lora; true CFG as diffusers runs it; a wrong-shape LoRA refused naming the layer; the
judgement of a Qwen-Image LoRA's origin (card, metadata, names) and its routing beside the FLUX.1, Z-Image and
SDXL pools; previews through the Wan 2.1 projection; the base bit-exact after swaps and failures. Everything the
family needs is engine/families/qwen_image.py (and its tiny builder, engine/families/tiny_qwen_image.py).
Its namings against diffusers' fuse and its base bit-exact after swaps: test_swaps.py (tests/support/swaps.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import QwenImagePipeline

from engine.errors import IncompatibleLoraError
from engine.families.origin import judge_origin
from engine.families.qwen_image import FAMILY, LATENT_RGB, convert_lora
from engine.families.registry import family_spec
from engine.pools.routing import pick_pool
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from families.flux import MODEL_ID as FLUX_MODEL_ID
from families.qwen_image import MODEL_ID
from lora_catalog.bases import family_from_keys, family_from_metadata
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import PROMPT, assert_components_pristine, local_engine, pixels, preview_frames, served_pools
from tests.support.images import assert_images_close
from tests.support.qwen_image import CASES, MODULES, diffusers_image, factors, lora_file, write_qwen_loras


def request(*loras: LoraSpec, seed: int = 7, guidance: float = 1.0) -> GenerateRequest:
    return GenerateRequest(
        prompt=PROMPT, loras=tuple(loras), steps=3, guidance=guidance, width=64, height=64, seed=seed
    )


@pytest.fixture(scope="module")
def qwen_loras(loaded_qwen_image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen-loras")
    write_qwen_loras(loaded_qwen_image.pipe, folder)
    # Made for a wider Qwen-Image (64 wide, where the tiny one is 72): its factors fit no served layer.
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in MODULES[:2]}
    save_lora(folder / "qwen_wide.safetensors", lora_file(wide, "peft", None))
    # lightx2v's speed LoRA as its file is named (its factors here are random, in its bare names).
    lightning = lora_file(factors(loaded_qwen_image.pipe.transformer, seed=58), "bare", 16.0)
    save_lora(folder / "Qwen-Image-Lightning-4steps-V1.0.safetensors", lightning)
    return folder


@pytest.fixture
def qwen_engine(family_engine, qwen_loras):
    return family_engine(Family.QWEN_IMAGE, qwen_loras)


# -- the family --------------------------------------------------------------------------------------------


def test_the_tiny_qwen_image_pipeline_has_qwen_images_structure(loaded_qwen_image):
    pipe = loaded_qwen_image.pipe
    assert type(pipe) is QwenImagePipeline and loaded_qwen_image.family is FAMILY
    assert family_spec(MODEL_ID) is FAMILY and loaded_qwen_image.components == ("transformer",)
    assert type(pipe.text_encoder).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert type(pipe.vae).__name__ == "AutoencoderKLQwenImage" and pipe.vae.config.z_dim == 16
    # Qwen-Image's latent normalisation (its VAE's encoder is Wan 2.1's).
    assert pipe.vae.config.latents_mean[:2] == [-0.7571, -0.7089]
    assert pipe.tokenizer.convert_ids_to_tokens(pipe.tokenizer("a fox").input_ids) == ["a", "\u0120fox"]
    assert pipe.tokenizer.convert_tokens_to_ids("<|image_pad|>") == pipe.text_encoder.config.image_token_id
    # The prompt template's system turn is the 34 tokens the pipeline drops, as with Qwen's own tokenizer.
    system_turn = pipe.prompt_template_encode.split("{}")[0]
    assert len(pipe.tokenizer(system_turn).input_ids) == pipe.prompt_template_encode_start_idx == 34
    defaults = loaded_qwen_image.defaults
    assert (defaults.side, defaults.guidance, defaults.guidance_kind, defaults.negative_prompt) == (
        64,
        4.0,
        "cfg",
        True,
    )
    assert defaults.is_tiny and defaults.side_multiple == 8  # the tiny VAE's 4 times the 2x2 patches
    assert defaults.schedulers == ("FlowMatchEulerDiscreteScheduler",)
    assert sum(p.numel() for p in pipe.transformer.parameters()) < 500_000


def test_qwen_images_defaults_call_and_sizes():
    real = SimpleNamespace(vae_scale_factor=8, default_sample_size=128, vae=SimpleNamespace(config=SimpleNamespace()))
    defaults = FAMILY.defaults(real)
    assert (defaults.steps, defaults.guidance, defaults.guidance_kind, defaults.side_multiple) == (50, 4.0, "cfg", 16)
    assert FAMILY.served_side(real) == 1024
    guided = FAMILY.call_arguments(CheckedRequest(prompt="x", guidance=4.0, width=64))
    assert guided["true_cfg_scale"] == 4.0 and guided["negative_prompt"] == " " and "guidance_scale" not in guided
    blurry = FAMILY.call_arguments(CheckedRequest(prompt="x", negative_prompt="blurry", guidance=2.5))
    assert blurry["negative_prompt"] == "blurry"
    assert (
        FAMILY.call_arguments(CheckedRequest(prompt="x", negative_prompt="blurry", guidance=1.0))["negative_prompt"]
        is None
    )
    # The card's aspect ratios at 1328 px, scaled to the 1024 served side (multiples of 64).
    assert FAMILY.size_presets(1024, 2048)[:3] == ((1024, 1024), (1280, 704), (704, 1280))
    assert FAMILY.size_presets(1328, 2048)[0] == (1328, 1328)


# -- every format, against diffusers -------------------------------------------------------------------------


def test_every_naming_converts_to_the_same_factors(qwen_loras, loaded_qwen_image):
    """The namings of one set of factors all come out of the converter as the same diffusers tensors."""
    made = factors(loaded_qwen_image.pipe.transformer, seed=3)
    converted = [convert_lora(lora_file(made, c.fmt, c.alpha), None)[0] for c in CASES if c.alpha is not None]
    first = converted[0]
    assert len(first) == 2 * len(MODULES) and "transformer.norm_out.linear.lora_A.weight" in first
    for other in converted[1:]:
        assert other.keys() == first.keys() and all(torch.equal(other[k], first[k]) for k in first)


def test_diffusers_named_files_with_alphas_or_peft_default_convert_as_their_bare_twins(qwen_loras):
    """diffusers 0.42 makes `transformer.transformer.` of these (and its loader then finds no layer); the family's
    converter gives exactly what diffusers' gives for the same factors under bare names."""
    from safetensors.torch import load_file

    for case in (c for c in CASES if c.twin is not None):
        file, twin = load_file(qwen_loras / case.file_name), load_file(qwen_loras / case.reference_name)
        doubled = QwenImagePipeline.lora_state_dict(dict(file))
        assert all(k.startswith("transformer.transformer.") for k in doubled), case.name
        ours, by_diffusers = convert_lora(dict(file), None)[0], QwenImagePipeline.lora_state_dict(dict(twin))
        assert ours.keys() == by_diffusers.keys() and all(torch.equal(ours[k], by_diffusers[k]) for k in ours)


def test_the_converter_never_changes_the_dict_it_is_given(loaded_qwen_image):
    state = lora_file(factors(loaded_qwen_image.pipe.transformer, seed=4), "peft", 2.0)
    names = set(state)
    convert_lora(state, None)
    assert set(state) == names


def test_with_true_cfg_the_image_is_diffusers_cfg(qwen_engine, qwen_loras, tiny_qwen_image_dir):
    """Above 1, `guidance` is true CFG against the negative prompt (the card's " " when there is none), as
    diffusers runs it."""
    lora = LoraSpec("local:qwen_kohya.safetensors")
    ours = pixels(generate(qwen_engine, request(lora, guidance=4.0)).image)
    assert_images_close(ours, diffusers_image(tiny_qwen_image_dir, qwen_loras, "qwen_kohya.safetensors", guidance=4.0))
    blurry = dataclasses.replace(request(lora, guidance=4.0), negative_prompt="a blurry photo")
    against = pixels(generate(qwen_engine, blurry).image)
    reference = diffusers_image(
        tiny_qwen_image_dir, qwen_loras, "qwen_kohya.safetensors", guidance=4.0, negative_prompt="a blurry photo"
    )
    assert_images_close(against, reference)
    # The tiny transformer's random text path moves its image little; CFG still moves it.
    unguided = pixels(generate(qwen_engine, request(lora)).image)
    assert not np.array_equal(against, unguided) and not np.array_equal(ours, against)


def test_without_a_lora_the_image_is_diffusers_own(qwen_engine, qwen_loras, tiny_qwen_image_dir):
    ours = pixels(generate(qwen_engine, request()).image)
    assert_images_close(ours, diffusers_image(tiny_qwen_image_dir, qwen_loras, None))


def test_qwen_image_lightning_brings_its_steps_no_cfg_and_the_flow_euler_sampler(qwen_engine):
    """As SDXL-Lightning's: where the client sets nothing, lightx2v's file name sets 4 steps, true CFG off
    (guidance 1) and Euler on the flow; the image is the one those settings give when sent explicitly."""
    lightning = LoraSpec("local:Qwen-Image-Lightning-4steps-V1.0.safetensors")
    result = generate(qwen_engine, GenerateRequest(prompt=PROMPT, loras=(lightning,), width=64, height=64, seed=7))
    checked = result.request
    assert (checked.steps, checked.guidance, checked.sampler) == (4, 1.0, "Euler flow")
    assert "speed LoRA (Qwen-Image-Lightning" in dict(checked.defaults_from)["steps"]
    explicit = GenerateRequest(
        prompt=PROMPT, loras=(lightning,), steps=4, guidance=1.0, scheduler="Euler flow", width=64, height=64, seed=7
    )
    assert generate(qwen_engine, explicit).image.tobytes() == result.image.tobytes()


# -- wrong shapes -------------------------------------------------------------------------------------------


def test_a_qwen_image_lora_whose_shapes_fit_nothing_is_refused_naming_the_layer(
    qwen_engine, loaded_qwen_image, pristine_qwen_image
):
    with pytest.raises(
        IncompatibleLoraError, match=r"factors \(64, 2\) x \(2, 64\) do not fit transformer\.transformer_blocks\.0"
    ) as caught:
        qwen_engine.check_lora(LoraSpec("local:qwen_wide.safetensors"))
    assert caught.value.status == 400 and "(72, 72)" in str(caught.value)
    qwen_engine.restore_base_weights()
    assert_components_pristine(loaded_qwen_image.pipe, pristine_qwen_image, ("transformer",))


# -- origin and routing -------------------------------------------------------------------------------------


def test_every_qwen_image_naming_is_judged_by_its_names_and_routed_beside_flux_zimage_and_sdxl(tiny_pipes, qwen_loras):
    from lora_catalog.sft_header import read_header

    pools = served_pools(tiny_pipes)
    assert {Family.SDXL, Family.FLUX, Family.ZIMAGE, Family.QWEN_IMAGE} <= {p.family for p in pools}
    for case in CASES:
        header = read_header(qwen_loras / case.file_name)
        shapes = {name: info.shape for name, info in header.tensors.items()}
        origin = judge_origin([], lambda s=shapes: ({}, s))
        assert origin.families == (Family.QWEN_IMAGE,) and origin.denoiser_dims == {72}, case.name
        assert pools[pick_pool("LoRA 'x'", origin, pools)].family is Family.QWEN_IMAGE, case.name
        assert family_from_keys(shapes) is Family.QWEN_IMAGE, case.name


def test_attention_only_names_over_sixty_blocks_are_qwen_images_not_flux1s():
    """diffusers names FLUX.1's double blocks as Qwen-Image's blocks; FLUX.1 has 19, Qwen-Image 60, and at real
    width both are 3072 wide: the blocks past FLUX.1's decide."""
    shapes = {
        f"transformer.transformer_blocks.{i}.attn.{p}.lora_{ab}.weight": (16, 3072) if ab == "A" else (3072, 16)
        for i in range(60)
        for p in ("to_q", "to_k", "to_v")
        for ab in "AB"
    }
    assert judge_origin([], lambda: ({}, shapes)).families == (Family.QWEN_IMAGE,)
    flux1 = {name: shape for name, shape in shapes.items() if int(name.split(".")[2]) < 19}
    # Chroma has FLUX.1's 19 double blocks too (test_chroma.py).
    assert set(judge_origin([], lambda: ({}, flux1)).families) == {Family.FLUX, Family.QWEN_IMAGE, Family.CHROMA}


def test_the_card_the_metadata_and_civitai_decide_for_qwen_image():
    from lora_catalog.civitai.bases import civitai_base

    origin = judge_origin([MODEL_ID], lambda: pytest.fail("the card decides"))
    assert (origin.families, origin.how) == ((Family.QWEN_IMAGE,), "card")
    for metadata in (
        {"ss_base_model_version": "qwen_image"},
        {"modelspec.architecture": "Qwen-Image/lora"},
        {"ss_sd_model_name": "qwen_image_bf16.safetensors"},
    ):
        assert family_from_metadata(metadata) is Family.QWEN_IMAGE, metadata
        assert judge_origin(["me/unknown-tune"], lambda m=metadata: (m, {})).families == (Family.QWEN_IMAGE,)
    base = civitai_base("Qwen")
    assert base is not None and base.family is Family.QWEN_IMAGE and base.base_model_id == MODEL_ID


def test_a_qwen_image_lora_in_an_engine_serving_flux_is_refused_naming_the_family(
    loaded_flux, base_settings, qwen_loras
):
    settings = base_settings.replace(local_lora_dir=qwen_loras, base_model_id=FLUX_MODEL_ID)
    refused = pytest.raises(IncompatibleLoraError, match=r"trained for the qwen_image family")
    with local_engine(loaded_flux, settings, qwen_loras) as engine, refused as caught:
        engine.check_lora(LoraSpec("local:qwen_kohya.safetensors"))
    assert caught.value.status == 400


# -- previews -----------------------------------------------------------------------------------------------


def test_previews_project_the_unpacked_latents_through_wan_2_1s_factors(loaded_qwen_image, base_settings):
    assert FAMILY.preview.tiny_vae is None and FAMILY.preview.projection is LATENT_RGB
    assert len(LATENT_RGB.weights) == loaded_qwen_image.pipe.vae.config.z_dim
    settings = base_settings.replace(base_model_id=MODEL_ID, preview_vae="none", preview_every=1)
    frames = preview_frames(loaded_qwen_image, settings, request())
    assert [step for step, _ in frames] == [1, 2]
    # At latent resolution: 64 px over the tiny VAE's 4x.
    assert all(image.size == (16, 16) for _, image in frames)
