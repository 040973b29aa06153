"""Z-Image Turbo on the tiny Z-Image pipeline: every LoRA naming diffusers' loader reads, against its
load_lora_weights + fuse_lora; a wrong-shape LoRA refused naming the layer; the judgement of a Z-Image LoRA's
origin and its routing beside the FLUX and SDXL pools; previews through FLUX.1's latent space; the base
bit-exact after swaps and failures. The second DiT family: everything it needs is engine/families/zimage.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import AutoencoderTiny, ZImagePipeline

from engine.errors import IncompatibleLoraError
from engine.families import flux
from engine.families.origin import judge_origin
from engine.families.registry import family_spec, served_specs
from engine.families.zimage import FAMILY, convert_lora
from engine.models import ZIMAGE_MODEL_ID
from engine.pools.engine import Engine
from engine.pools.routing import PoolInfo, pick_pool
from engine.prepare.resolve import AdapterResolver
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from lora_catalog.bases import family_from_keys, family_from_metadata
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.images import assert_images_close
from tests.support.zimage import CASES, MODULES, lora_file, write_zimage_loras

PROMPT = "a photo of a fox in sks style"


def request(*loras: LoraSpec, seed: int = 7, guidance: float = 0.0) -> GenerateRequest:
    return GenerateRequest(
        prompt=PROMPT, loras=tuple(loras), steps=3, guidance=guidance, width=64, height=64, seed=seed
    )


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


@pytest.fixture(scope="module")
def zimage_loras(loaded_zimage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("zimage-loras")
    write_zimage_loras(loaded_zimage.pipe, folder)
    # Made for a wider Z-Image (64 wide, where the tiny one is 24): its factors fit no served layer.
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in MODULES[:2]}
    save_lora(folder / "zimage_wide.safetensors", lora_file(wide, "peft", None))
    return folder


@pytest.fixture
def zimage_engine(loaded_zimage, base_settings, zimage_loras):
    settings = base_settings.replace(local_lora_dir=zimage_loras, base_model_id=ZIMAGE_MODEL_ID)
    resolver = AdapterResolver(None, local_dir=zimage_loras, token=None, max_bytes=settings.max_adapter_bytes)
    engine = Engine(loaded_zimage, settings, resolver)
    yield engine
    engine.close()


def diffusers_image(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0, guidance: float = 0.0):
    """diffusers' own result: load_lora_weights, then fuse_lora of the transformer (the one component its
    Z-Image loader adapts)."""
    pipe = ZImagePipeline.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    if weight_name is not None:
        pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
        pipe.fuse_lora(components=["transformer"], lora_scale=scale)
    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(
        prompt=PROMPT, num_inference_steps=3, guidance_scale=guidance, width=64, height=64, generator=generator
    ).images[0]


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


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_zimage_lora_format_matches_diffusers_fuse(zimage_engine, zimage_loras, tiny_zimage_dir, case):
    base = pixels(generate(zimage_engine, request()).image)
    ours = pixels(generate(zimage_engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8))).image)
    reference = pixels(diffusers_image(tiny_zimage_dir, zimage_loras, case.reference_name, scale=0.8))
    assert np.abs(reference - base).mean() > 2, "the LoRA must visibly change the image"
    assert_images_close(ours, reference)
    assert np.abs(ours - reference).mean() < 0.1
    assert zimage_engine.check_lora(LoraSpec(f"local:{case.file_name}")).components == ("transformer",)


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
    for key, value in loaded_zimage.pipe.transformer.state_dict().items():
        assert torch.equal(value, pristine_zimage[f"transformer.{key}"]), key


# -- origin and routing -------------------------------------------------------------------------------------


def served_pools(tiny_pipes) -> list[PoolInfo]:
    pools = []
    for spec in served_specs():
        pipe = tiny_pipes[spec.family]
        encoders = {c: getattr(pipe, c) for c in spec.components if c != spec.denoiser}
        widths = spec.signature.pipeline_widths(getattr(pipe, spec.denoiser), encoders)
        pools.append(PoolInfo(f"base/{spec.family}", spec.family, widths.denoiser, widths.text))
    return pools


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
    resolver = AdapterResolver(None, local_dir=zimage_loras, token=None, max_bytes=settings.max_adapter_bytes)
    engine = Engine(loaded_flux, settings, resolver)
    try:
        with pytest.raises(IncompatibleLoraError, match=r"trained for the zimage family"):
            engine.check_lora(LoraSpec("local:zimage_kohya.safetensors"))
    finally:
        engine.close()


# -- previews -----------------------------------------------------------------------------------------------


def test_previews_decode_zimage_latents_as_flux1s(loaded_zimage, base_settings, tmp_path):
    assert FAMILY.preview.tiny_vae == "madebyollin/taef1" and FAMILY.preview.projection is flux.LATENT_RGB
    assert FAMILY.preview.unpack is None  # Z-Image's latents are spatial between steps
    torch.manual_seed(0)
    AutoencoderTiny(latent_channels=16).save_pretrained(tmp_path / "taef1")  # TAEF1's architecture
    for source, size in ((str(tmp_path / "taef1"), (256, 256)), ("none", (32, 32))):
        settings = base_settings.replace(base_model_id=ZIMAGE_MODEL_ID, preview_vae=source, preview_every=1)
        resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=settings.max_adapter_bytes)
        engine = Engine(loaded_zimage, settings, resolver)
        frames = []
        try:
            with engine.prepare(request()) as prepared:
                engine.run(prepared, preview=lambda step, image, frames=frames: frames.append((step, image)))
        finally:
            engine.close()
        assert [step for step, _ in frames] == [1, 2]
        assert all(image.size == size for _, image in frames), source


# -- exactness ----------------------------------------------------------------------------------------------


def test_the_base_is_bit_exact_after_swaps_across_formats_and_failures(zimage_engine, loaded_zimage, pristine_zimage):
    base = generate(zimage_engine, request()).image.tobytes()
    for index, case in enumerate((*CASES, *CASES)):
        generate(zimage_engine, dataclasses.replace(request(LoraSpec(f"local:{case.file_name}")), steps=1))
        if index % 3 == 1:
            with pytest.raises(IncompatibleLoraError):
                generate(zimage_engine, request(LoraSpec("local:zimage_wide.safetensors")))
    zimage_engine.restore_base_weights()
    for name in ("transformer", "text_encoder", "vae"):
        for key, value in getattr(loaded_zimage.pipe, name).state_dict().items():
            assert torch.equal(value, pristine_zimage[f"{name}.{key}"]), f"{name}.{key} drifted"
    assert generate(zimage_engine, request()).image.tobytes() == base
