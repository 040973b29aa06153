"""Z-Image Turbo on the tiny Z-Image pipeline: every LoRA naming diffusers' loader reads, against its
load_lora_weights + fuse_lora; a wrong-shape LoRA refused naming the layer; the judgement of a Z-Image LoRA's
origin and its routing beside the FLUX and SDXL pools; previews through FLUX.1's latent space; the base
bit-exact after swaps and failures. The second DiT family: everything it needs is engine/families/zimage.py.
Its namings against diffusers' fuse and its base bit-exact after swaps: test_swaps.py (tests/support/swaps.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import ZImagePipeline

from engine.errors import IncompatibleLoraError
from engine.families import flux
from engine.families.origin import judge_origin
from engine.families.registry import family_spec
from engine.families.zimage import FAMILY, convert_lora
from engine.pools.routing import pick_pool
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID
from lora_catalog.bases import family_from_keys, family_from_metadata
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import (
    PROMPT,
    assert_components_pristine,
    local_engine,
    pixels,
    preview_frames,
    save_taef1,
    served_pools,
)
from tests.support.dit import diffusers_image as dit_image
from tests.support.images import assert_images_close
from tests.support.zimage import CASES, MODULES, lora_file, write_zimage_loras


def request(*loras: LoraSpec, seed: int = 7, guidance: float = 0.0) -> GenerateRequest:
    return GenerateRequest(
        prompt=PROMPT, loras=tuple(loras), steps=3, guidance=guidance, width=64, height=64, seed=seed
    )


@pytest.fixture(scope="module")
def zimage_loras(loaded_zimage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("zimage-loras")
    write_zimage_loras(loaded_zimage.pipe, folder)
    # Made for a wider Z-Image (64 wide, where the tiny one is 24): its factors fit no served layer.
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in MODULES[:2]}
    save_lora(folder / "zimage_wide.safetensors", lora_file(wide, "peft", None))
    return folder


@pytest.fixture
def zimage_engine(family_engine, zimage_loras):
    return family_engine(Family.ZIMAGE, zimage_loras)


def diffusers_image(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0, guidance: float = 0.0):
    """diffusers' own result: load_lora_weights, then fuse_lora of the transformer (the one component its
    Z-Image loader adapts)."""
    components = ("transformer",)
    return dit_image(
        ZImagePipeline, tiny_dir, folder, weight_name, components=components, scale=scale, guidance=guidance
    )


# -- the family --------------------------------------------------------------------------------------------


def test_the_tiny_zimage_pipeline_has_z_image_turbos_structure(loaded_zimage):
    pipe = loaded_zimage.pipe
    assert type(pipe) is ZImagePipeline and loaded_zimage.family is FAMILY
    assert family_spec(ZIMAGE_MODEL_ID) is FAMILY and loaded_zimage.components == ("transformer",)
    assert type(pipe.text_encoder).__name__ == "Qwen3Model" and pipe.vae.config.latent_channels == 16
    assert (pipe.vae.config.scaling_factor, pipe.vae.config.shift_factor) == (0.3611, 0.1159)  # FLUX.1's VAE
    # The Qwen tokenizer is built from the tiny vocabulary and survives the folder round trip, chat template too.
    chat = pipe.tokenizer.apply_chat_template([{"role": "user", "content": "a fox"}], tokenize=False)
    assert chat.startswith("<|im_start|>user\na fox<|im_end|>")
    assert pipe.tokenizer.convert_ids_to_tokens(pipe.tokenizer("a fox").input_ids) == ["a", "\u0120fox"]
    defaults = loaded_zimage.defaults
    assert (defaults.side, defaults.guidance, defaults.guidance_kind, defaults.negative_prompt) == (
        64,
        0.0,
        "cfg",
        True,
    )
    assert defaults.is_tiny and defaults.side_multiple == 4  # the tiny VAE's 2 times the 2x2 patches
    assert sum(p.numel() for p in pipe.transformer.parameters()) < 500_000


def test_turbos_defaults_and_call():
    real = SimpleNamespace(vae_scale_factor=8)
    defaults = FAMILY.defaults(real)
    assert (defaults.steps, defaults.guidance, defaults.guidance_kind, defaults.side_multiple) == (9, 0.0, "cfg", 16)
    arguments = FAMILY.call_arguments(CheckedRequest(prompt="x", negative_prompt="blurry", guidance=2.0, width=64))
    assert arguments["negative_prompt"] == "blurry" and arguments["guidance_scale"] == 2.0
    assert FAMILY.size_presets(1024, 1344)[:3] == ((1024, 1024), (1152, 896), (896, 1152))


# -- every format, against diffusers -------------------------------------------------------------------------


def test_comfyuis_fused_qkv_is_split_as_diffusers_splits_kohyas(zimage_loras, loaded_zimage):
    """diffusers 0.42 passes ComfyUI's `attention.qkv.lora_down` on unsplit (and its loader then drops it); the
    family's converter hands it to diffusers' own split, which gives exactly what kohya's names give."""
    from safetensors.torch import load_file

    case = next(c for c in CASES if c.fmt == "comfy_native")
    comfy, twin = load_file(zimage_loras / case.file_name), load_file(zimage_loras / case.reference_name)
    assert any(k.endswith(".attention.qkv.lora_down.weight") for k in comfy)
    assert any(".attention.qkv." in k for k in ZImagePipeline.lora_state_dict(dict(comfy)))  # unsplit
    ours, alphas = convert_lora(dict(comfy), loaded_zimage.pipe.transformer)
    by_diffusers = ZImagePipeline.lora_state_dict(dict(twin))
    assert alphas is None and ours.keys() == by_diffusers.keys()
    assert "transformer.layers.0.attention.to_k.lora_B.weight" in ours
    assert all(torch.equal(ours[k], by_diffusers[k]) for k in ours)


def test_with_guidance_and_a_negative_prompt_the_image_is_diffusers_cfg(zimage_engine, zimage_loras, tiny_zimage_dir):
    """Above 0, Turbo's guidance is true CFG: the engine's call reads the negative prompt as diffusers does."""
    ours = pixels(generate(zimage_engine, request(LoraSpec("local:zimage_kohya.safetensors"), guidance=2.0)).image)
    reference = diffusers_image(tiny_zimage_dir, zimage_loras, "zimage_kohya.safetensors", guidance=2.0)
    assert_images_close(ours, reference)
    unguided = pixels(generate(zimage_engine, request(LoraSpec("local:zimage_kohya.safetensors"))).image)
    assert np.abs(ours - unguided).mean() > 1


def test_without_a_lora_the_image_is_diffusers_own(zimage_engine, zimage_loras, tiny_zimage_dir):
    ours = pixels(generate(zimage_engine, request()).image)
    assert_images_close(ours, diffusers_image(tiny_zimage_dir, zimage_loras, None))


# -- wrong shapes -------------------------------------------------------------------------------------------


def test_a_zimage_lora_whose_shapes_fit_nothing_is_refused_naming_the_layer(
    zimage_engine, loaded_zimage, pristine_zimage
):
    with pytest.raises(
        IncompatibleLoraError, match=r"factors \(64, 2\) x \(2, 64\) do not fit transformer\.layers\.0\.attention"
    ) as caught:
        zimage_engine.check_lora(LoraSpec("local:zimage_wide.safetensors"))
    assert caught.value.status == 400 and "(24, 24)" in str(caught.value)
    zimage_engine.restore_base_weights()
    assert_components_pristine(loaded_zimage.pipe, pristine_zimage, ("transformer",))


# -- origin and routing -------------------------------------------------------------------------------------


def test_every_zimage_naming_is_judged_zimage_by_its_names_and_routed_beside_flux_and_sdxl(tiny_pipes, zimage_loras):
    from lora_catalog.sft_header import read_header

    pools = served_pools(tiny_pipes)
    assert {Family.SDXL, Family.FLUX, Family.ZIMAGE} <= {p.family for p in pools}
    for case in CASES:
        header = read_header(zimage_loras / case.file_name)
        shapes = {name: info.shape for name, info in header.tensors.items()}
        origin = judge_origin([], lambda s=shapes: ({}, s))
        assert origin.families == (Family.ZIMAGE,) and origin.denoiser_dims == {24}, case.name
        assert pools[pick_pool("LoRA 'x'", origin, pools)].family is Family.ZIMAGE, case.name
        assert family_from_keys(shapes) is Family.ZIMAGE, case.name


def test_the_card_and_the_metadata_decide_for_zimage():
    origin = judge_origin(["Tongyi-MAI/Z-Image-Turbo"], lambda: pytest.fail("the card decides"))
    assert (origin.families, origin.how) == ((Family.ZIMAGE,), "card")
    for metadata in ({"ss_base_model_version": "zimage"}, {"modelspec.architecture": "Z-Image-Turbo/lora"}):
        assert family_from_metadata(metadata) is Family.ZIMAGE
        assert judge_origin(["me/unknown-tune"], lambda m=metadata: (m, {})).families == (Family.ZIMAGE,)


def test_a_zimage_lora_in_an_engine_serving_flux_is_refused_naming_the_family(loaded_flux, base_settings, zimage_loras):
    settings = base_settings.replace(local_lora_dir=zimage_loras, base_model_id="black-forest-labs/FLUX.1-dev")
    refused = pytest.raises(IncompatibleLoraError, match=r"trained for the zimage family")
    with local_engine(loaded_flux, settings, zimage_loras) as engine, refused:
        engine.check_lora(LoraSpec("local:zimage_kohya.safetensors"))


# -- previews -----------------------------------------------------------------------------------------------


def test_previews_decode_zimage_latents_as_flux1s(loaded_zimage, base_settings, tmp_path):
    assert FAMILY.preview.tiny_vae == "madebyollin/taef1" and FAMILY.preview.projection is flux.LATENT_RGB
    assert FAMILY.preview.unpack is None  # Z-Image's latents are spatial between steps
    save_taef1(tmp_path / "taef1")  # TAEF1's architecture
    for source, size in ((str(tmp_path / "taef1"), (256, 256)), ("none", (32, 32))):
        settings = base_settings.replace(base_model_id=ZIMAGE_MODEL_ID, preview_vae=source, preview_every=1)
        frames = preview_frames(loaded_zimage, settings, request())
        assert [step for step, _ in frames] == [1, 2]
        assert all(image.size == size for _, image in frames), source
