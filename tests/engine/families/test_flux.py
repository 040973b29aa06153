"""FLUX.1 on the tiny FLUX pipeline: every LoRA naming diffusers reads, against its load_lora_weights + fuse_lora;
the kohya `linear1` split at real width against diffusers' converter; wrong shapes refused; the judgement of a
FLUX LoRA's origin; previews from packed latents; the base bit-exact after swaps and failures.
Its namings against diffusers' fuse and its base bit-exact after swaps: test_swaps.py (tests/support/swaps.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from diffusers.image_processor import VaeImageProcessor
from diffusers.loaders.lora_conversion_utils import _convert_kohya_flux_lora_to_diffusers
from safetensors.torch import load_file

from engine.errors import IncompatibleLoraError
from engine.families.flux import FAMILY, LATENT_RGB, REAL_LINEAR1, convert_lora, linear1_widths
from engine.families.origin import judge_origin
from engine.pipeline.preview import LinearPreview, TinyVaePreview
from engine.pools.routing import pick_pool
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from tests.support.checks import generate
from tests.support.dit import (
    PROMPT,
    assert_components_pristine,
    pixels,
    preview_frames,
    save_taef1,
    served_pools,
)
from tests.support.dit import diffusers_image as dit_image
from tests.support.flux import BFL_CASES, CASES, assert_same_updates, write_flux_loras
from tests.support.images import assert_images_close

FLUX = "black-forest-labs/FLUX.1-dev"


def request(*loras: LoraSpec, seed: int = 7) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=tuple(loras), steps=3, guidance=3.5, width=64, height=64, seed=seed)


@pytest.fixture(scope="module")
def flux_loras(loaded_flux, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("flux-loras")
    write_flux_loras(loaded_flux.pipe, folder, cases=(*CASES, *BFL_CASES))
    return folder


@pytest.fixture(scope="module")
def wide_loras(flux_loras) -> Path:
    """FLUX LoRAs made for a wider FLUX (48 wide: linear1 has 3 x 48 + 192 rows), in kohya and diffusers names."""
    with torch.device("meta"):
        wider = FluxTransformer2DModel(num_layers=1, num_single_layers=1, num_attention_heads=3, attention_head_dim=16)
    kohya, _ = make_flux_lora(flux_layers(wider, double=(), single=("linear1",)), rank=2, seed=4).file("kohya")
    save_lora(flux_loras / "wide_kohya.safetensors", kohya)
    save_lora(flux_loras / "wide_peft.safetensors", make_flux_lora(flux_layers(wider), rank=2, seed=5).twin())
    return flux_loras


@pytest.fixture
def flux_engine(family_engine, flux_loras):
    return family_engine(Family.FLUX, flux_loras)


def diffusers_image(tiny_flux_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0):
    """diffusers' own result: load_lora_weights, then fuse_lora of both components (its default fuses the
    transformer only, and a LoRA's CLIP part would stay a live layer)."""
    components = ("transformer", "text_encoder")
    return dit_image(FluxPipeline, tiny_flux_dir, folder, weight_name, components=components, scale=scale, guidance=3.5)


# -- the family --------------------------------------------------------------------------------------------


def test_the_tiny_flux_pipeline_has_flux1_devs_structure(loaded_flux, tiny_flux_dir):
    pipe = loaded_flux.pipe
    assert type(pipe) is FluxPipeline and loaded_flux.family is FAMILY
    assert loaded_flux.components == ("transformer", "text_encoder")
    assert pipe.transformer.config.guidance_embeds and pipe.vae.config.latent_channels == 16
    assert type(pipe.text_encoder_2).__name__ == "T5EncoderModel"
    # The T5 tokenizer is built from its tiny vocabulary and survives the folder round trip: words are pieces.
    ids = pipe.tokenizer_2("a photo of a fox").input_ids
    assert pipe.tokenizer_2.unk_token_id not in ids and ids[-1] == pipe.tokenizer_2.eos_token_id
    defaults = loaded_flux.defaults
    assert (defaults.side, defaults.guidance, defaults.guidance_kind, defaults.negative_prompt) == (
        64,
        3.5,
        "distilled",
        False,
    )
    assert defaults.is_tiny and defaults.side_multiple == 4  # the tiny VAE's 2 times the 2x2 patches
    assert sum(p.numel() for p in pipe.transformer.parameters()) < 500_000


def test_dev_and_schnell_defaults_follow_the_served_transformers_guidance_embedding():
    def pipe(guidance_embeds: bool) -> SimpleNamespace:
        config = SimpleNamespace(guidance_embeds=guidance_embeds)
        return SimpleNamespace(transformer=SimpleNamespace(config=config), vae_scale_factor=8)

    dev, schnell = FAMILY.defaults(pipe(True)), FAMILY.defaults(pipe(False))
    assert (dev.steps, dev.guidance, dev.guidance_kind, dev.side_multiple) == (28, 3.5, "distilled", 16)
    assert (schnell.steps, schnell.guidance, schnell.guidance_kind) == (4, 0.0, "none")
    assert not dev.negative_prompt and not schnell.negative_prompt


def test_the_call_takes_no_negative_prompt_and_sides_go_in_sixteens(flux_engine):
    from engine.errors import InvalidRequestError
    from engine.requests import CheckedRequest

    arguments = FAMILY.call_arguments(CheckedRequest(prompt="x", negative_prompt="blurry", steps=2, width=64))
    assert "negative_prompt" not in arguments and arguments["guidance_scale"] == 0.0
    with pytest.raises(InvalidRequestError, match=r"width=66 is not a multiple of 4; accepted: 64 to 256 in 4s"):
        generate(flux_engine, dataclasses.replace(request(), width=66))


# -- every format, against diffusers -------------------------------------------------------------------------


def test_without_a_lora_the_image_is_diffusers_own(flux_engine, flux_loras, tiny_flux_dir):
    ours = pixels(generate(flux_engine, request()).image)
    assert_images_close(ours, diffusers_image(tiny_flux_dir, flux_loras, None))


@pytest.mark.parametrize("sparse", [False, True])
def test_the_linear1_split_matches_diffusers_converter_at_flux1s_real_widths(sparse):
    """The tiny pipeline's kohya references load a twin split by rows q, k, v, MLP: at FLUX.1's widths that
    split is exactly the one diffusers' converter makes, and there the engine's converter pads nothing."""
    with torch.device("meta"):
        real = FluxTransformer2DModel(num_layers=1, num_single_layers=1)
    assert linear1_widths(real) == REAL_LINEAR1
    layers = flux_layers(real, double=("img_attn.qkv", "txt_attn.proj"), single=("linear1",))
    lora = make_flux_lora(layers, rank=4, seed=3, alpha=None if sparse else 2.0, sparse=sparse)
    kohya, _ = lora.file("kohya")
    by_diffusers = _convert_kohya_flux_lora_to_diffusers(dict(kohya))
    ours, alphas = convert_lora(dict(kohya), real)
    twin = lora.twin()
    assert alphas is None and ours.keys() == by_diffusers.keys() == twin.keys()
    assert all(torch.equal(ours[key], by_diffusers[key]) for key in ours)
    # diffusers puts the alpha's scale in the down factors, the twin in the up ones: their updates are equal.
    for key in (k.removesuffix(".lora_A.weight") for k in twin if k.endswith(".lora_A.weight")):
        update = by_diffusers[f"{key}.lora_B.weight"] @ by_diffusers[f"{key}.lora_A.weight"]
        assert torch.allclose(update, twin[f"{key}.lora_B.weight"] @ twin[f"{key}.lora_A.weight"], rtol=1e-5), key


@pytest.mark.parametrize("case", BFL_CASES, ids=lambda c: c.name)
def test_bfl_names_with_lora_a_and_b_load_where_diffusers_ignores_them(case, flux_loras, loaded_flux, tiny_flux_dir):
    """The flow trainer's and ComfyUI's BFL names with PEFT's factor names: diffusers' FLUX loader loads nothing
    from them, silently; ours reads exactly diffusers' reading of the same LoRA in its own names (its image against
    diffusers' fuse of that twin: test_swaps.py's flux-bfl rows)."""
    file = load_file(flux_loras / case.file_name)
    assert not any(k.startswith("transformer.") for k in FluxPipeline.lora_state_dict(dict(file)))
    assert diffusers_image(tiny_flux_dir, flux_loras, case.file_name).tobytes() == (
        diffusers_image(tiny_flux_dir, flux_loras, None).tobytes()
    )
    ours, _ = convert_lora(dict(file), loaded_flux.pipe.transformer)
    twin = load_file(flux_loras / case.twin_name)
    assert_same_updates(ours, twin)


# -- wrong shapes -------------------------------------------------------------------------------------------


def test_a_flux_lora_whose_shapes_fit_nothing_is_refused_naming_the_mismatch(
    flux_engine, wide_loras, loaded_flux, pristine_flux
):
    with pytest.raises(IncompatibleLoraError, match=r"linear1\.lora_up\.weight has 336 output rows; the served .* 224"):
        flux_engine.check_lora(LoraSpec("local:wide_kohya.safetensors"))
    with pytest.raises(
        IncompatibleLoraError, match=r"factors \(48, 2\) x \(2, 48\) do not fit transformer\..* of shape \(32, 32\)"
    ):
        flux_engine.check_lora(LoraSpec("local:wide_peft.safetensors"))
    flux_engine.restore_base_weights()
    assert_components_pristine(loaded_flux.pipe, pristine_flux, ("transformer", "text_encoder"))


# -- origin -------------------------------------------------------------------------------------------------


def test_every_flux_naming_is_judged_flux_by_its_names_and_routed_to_the_flux_pool(tiny_pipes, flux_loras):
    from lora_catalog.sft_header import read_header

    pools = served_pools(tiny_pipes)
    for case in (*CASES, *BFL_CASES):
        header = read_header(flux_loras / case.file_name)
        shapes = {name: info.shape for name, info in header.tensors.items()}
        origin = judge_origin([], lambda s=shapes: ({}, s))
        # kohya's `lora_te1_` CLIP names are SDXL's too: the transformer's names outvote them.
        assert origin.families == (Family.FLUX,), case.name
        assert pools[pick_pool("LoRA 'x'", origin, pools)].family is Family.FLUX, case.name


@pytest.mark.parametrize(
    "metadata", [{"modelspec.architecture": "flux-1-dev/lora"}, {"ss_base_model_version": "flux1"}]
)
def test_flux_metadata_decides_without_a_card(metadata):
    origin = judge_origin(["me/unknown-flux-tune"], lambda: (metadata, {}))
    assert (origin.families, origin.how) == ((Family.FLUX,), "metadata")


# -- previews -----------------------------------------------------------------------------------------------


def test_previews_unpack_flux_latents_for_taef1_and_the_linear_projection(loaded_flux, base_settings, tmp_path):
    taef1 = save_taef1(tmp_path / "taef1")  # TAEF1's architecture, random weights
    for source, size in ((str(tmp_path / "taef1"), (256, 256)), ("none", (32, 32))):
        settings = base_settings.replace(base_model_id=FLUX, preview_vae=source, preview_every=1)
        frames = preview_frames(loaded_flux, settings, request())
        assert [step for step, _ in frames] == [1, 2]
        # A 64 px image is 32x32 latents under the tiny VAE (packed as 16x16 tokens of 2x2 patches): TAEF1
        # upsamples them 8x, the linear preview stays at latent resolution.
        assert all(image.size == size for _, image in frames), source

    # Packed latents unpack as FluxPipeline unpacks them, then decode as it decodes with TAEF1 as its VAE.
    packed = torch.randn(1, 256, 64, generator=torch.Generator().manual_seed(1))
    spatial = FAMILY.preview.unpack(packed, 64, 64, 2)  # type: ignore[misc]
    assert spatial.shape == (1, 16, 32, 32)
    with torch.inference_mode():
        reference = VaeImageProcessor().postprocess(taef1.decode(spatial).sample, output_type="pil")[0]
    assert TinyVaePreview(taef1, "test")(spatial, None).tobytes() == reference.tobytes()
    assert LinearPreview(LATENT_RGB, Family.FLUX)(spatial, None).size == (32, 32)


# -- memory -------------------------------------------------------------------------------------------------


def test_a_fused_layers_shared_down_factor_is_held_once(flux_engine, flux_loras):
    """diffusers' converter gives q, k and v (and the MLP) of a fused layer one down factor: the cache counts and
    moves it once, so a kohya FLUX LoRA costs its file's size, not up to four times its down factors."""

    case = next(c for c in CASES if c.name == "kohya_linear1")
    file_bytes = sum(t.nbytes for t in load_file(flux_loras / case.file_name).values())
    with flux_engine.prepare(request(LoraSpec(f"local:{case.file_name}"))) as prepared:
        (adapter, *_), *_ = prepared.adapters
        moved = adapter.to(torch.device("cpu"), torch.bfloat16)
    assert adapter.nbytes <= file_bytes and moved.nbytes == adapter.nbytes // 2
