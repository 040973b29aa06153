"""FLUX.2 [klein] on the tiny klein pipeline: every LoRA naming diffusers' `Flux2LoraLoaderMixin` reads, against its
load_lora_weights + fuse_lora; ComfyUI's `lora_down` names (which diffusers drops) against their ai-toolkit twin;
FLUX.1's LoRAs told apart from FLUX.2's by names and MLP widths, each refused by the other's pool naming the
mismatch; the defaults of the distilled and base models; previews; the base bit-exact after swaps and failures.
The third DiT family: everything it needs is engine/families/flux2.py (and its tiny builder).
Its namings against diffusers' fuse and its base bit-exact after swaps: test_swaps.py (tests/support/swaps.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from diffusers import Flux2KleinPipeline
from safetensors.torch import load_file

from engine.errors import IncompatibleLoraError
from engine.families.flux2 import FAMILY, LATENT_RGB, convert_lora
from engine.families.origin import judge_origin
from engine.families.registry import family_spec
from engine.pipeline.loading import load_pipeline
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from families.flux import MODEL_ID as FLUX1
from families.flux2 import BASE_4B, MODEL_ID, MODEL_ID_9B
from lora_catalog.bases import family_from_metadata
from lora_catalog.civitai.bases import civitai_base
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import PROMPT, assert_components_pristine, local_engine, pixels, preview_frames
from tests.support.dit import diffusers_image as dit_image
from tests.support.flux import CASES as FLUX1_CASES
from tests.support.flux import write_flux_loras
from tests.support.flux2 import ATTENTION, CASES, lora_file, write_flux2_loras
from tests.support.images import assert_images_close


def request(*loras: LoraSpec, seed: int = 7) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=tuple(loras), steps=3, width=64, height=64, seed=seed)


@pytest.fixture(scope="module")
def flux2_loras(loaded_flux2, loaded_flux, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("flux2-loras")
    write_flux2_loras(loaded_flux2.pipe, folder)
    # Made for a klein of another width (64, where the tiny one is 56): its factors fit no served layer.
    wide = {k: (torch.ones(2, 64), torch.ones(3 * 64, 2)) for k in ATTENTION[:1]}
    save_lora(folder / "flux2_wide.safetensors", lora_file(wide, "aitk"))
    # FLUX.1's LoRAs for the tiny FLUX.1 (kohya with its modulations and CLIP, diffusers', ComfyUI's linear1).
    write_flux_loras(loaded_flux.pipe, folder, cases=FLUX1_CASES)
    return folder


@pytest.fixture
def flux2_engine(family_engine, flux2_loras):
    return family_engine(Family.FLUX2, flux2_loras)


def diffusers_image(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0):
    """diffusers' own result: load_lora_weights, then fuse_lora of the transformer (its loader's one component)."""
    return dit_image(
        Flux2KleinPipeline, tiny_dir, folder, weight_name, components=("transformer",), scale=scale, guidance=1.0
    )


# -- the family --------------------------------------------------------------------------------------------


def test_the_tiny_klein_has_flux2s_structure(loaded_flux2):
    pipe = loaded_flux2.pipe
    assert type(pipe) is Flux2KleinPipeline and loaded_flux2.family is FAMILY
    assert family_spec(MODEL_ID) is FAMILY and family_spec(MODEL_ID_9B) is FAMILY
    assert loaded_flux2.components == ("transformer",) and pipe.config.is_distilled
    assert type(pipe.text_encoder).__name__ == "Qwen3ForCausalLM" and pipe.vae.config.latent_channels == 32
    assert pipe.transformer.config.num_attention_heads * pipe.transformer.config.attention_head_dim == 56
    defaults = loaded_flux2.defaults
    assert (defaults.side, defaults.guidance_kind, defaults.negative_prompt) == (64, "none", False)
    assert defaults.is_tiny and defaults.side_multiple == 4  # the tiny VAE's 2 times the 2x2 patches
    assert sum(p.numel() for p in pipe.transformer.parameters()) < 500_000


def test_distilled_and_base_defaults_and_the_call():
    distilled = FAMILY.defaults(SimpleNamespace(vae_scale_factor=8, config=SimpleNamespace(is_distilled=True)))
    assert (distilled.steps, distilled.guidance_kind, distilled.side_multiple) == (4, "none", 16)
    base = FAMILY.defaults(SimpleNamespace(vae_scale_factor=8, config=SimpleNamespace(is_distilled=False)))
    assert (base.steps, base.guidance, base.guidance_kind, base.negative_prompt) == (50, 4.0, "cfg", False)
    arguments = FAMILY.call_arguments(CheckedRequest(prompt="x", negative_prompt="blurry", guidance=4.0, width=64))
    assert "negative_prompt" not in arguments and arguments["guidance_scale"] == 4.0
    assert FAMILY.size_presets(1024, 1344)[:3] == ((1024, 1024), (1152, 896), (896, 1152))


def test_klein_is_known_by_its_bases_metadata_and_civitai_labels():
    for label, base in (("Flux.2 Klein 9B", MODEL_ID_9B), ("flux.2 klein 4b", MODEL_ID)):
        found = civitai_base(label)
        assert found is not None and (found.family, found.base_model_id) == (Family.FLUX2, base)
    dev = civitai_base("Flux.2 D")  # FLUX.2 [dev]: another pipeline, its own family (test_flux2_dev.py)
    assert dev is not None and dev.family is Family.FLUX2_DEV
    for metadata in (
        {"ss_base_model_version": "flux2"},
        {"modelspec.architecture": "flux-2-klein-4b/lora"},
        {"ss_sd_model_name": "flux-2-klein-9b.safetensors"},
    ):
        assert family_from_metadata(metadata) is Family.FLUX2, metadata
    assert family_from_metadata({"ss_base_model_version": "flux1"}) is Family.FLUX
    origin = judge_origin([MODEL_ID_9B], lambda: pytest.fail("the card decides"))
    assert (origin.families, origin.how) == ((Family.FLUX2,), "card")


# -- every naming, against diffusers ------------------------------------------------------------------------


def test_comfyuis_lora_down_names_are_read_as_their_ai_toolkit_twin(flux2_loras, loaded_flux2):
    """diffusers hands `diffusion_model.…lora_down` to its kohya converter, which reads none of it (#13162's
    "No LoRA keys"); the family's converter renames it, the alpha folded, to what diffusers reads exactly."""
    case = next(c for c in CASES if c.fmt == "comfy")
    comfy, twin = load_file(flux2_loras / case.file_name), load_file(flux2_loras / case.reference_name)
    assert not Flux2KleinPipeline.lora_state_dict(dict(comfy))  # diffusers alone: nothing
    ours, alphas = convert_lora(dict(comfy), loaded_flux2.pipe.transformer)
    by_diffusers = Flux2KleinPipeline.lora_state_dict(dict(twin))
    assert alphas is None and ours.keys() == by_diffusers.keys() and len(ours) == 40
    assert all(torch.allclose(ours[k], by_diffusers[k], rtol=1e-6, atol=0) for k in ours)


def test_without_a_lora_the_image_is_diffusers_own(flux2_engine, flux2_loras, tiny_flux2_dir):
    ours = pixels(generate(flux2_engine, request()).image)
    assert_images_close(ours, diffusers_image(tiny_flux2_dir, flux2_loras, None))


@pytest.fixture(scope="module")
def tiny_base_dir(tiny_flux2_dir, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny klein as an undistilled base model: the same weights, `is_distilled` false in its model_index."""
    folder = tmp_path_factory.mktemp("tiny-flux2-base") / "pipeline"
    shutil.copytree(tiny_flux2_dir, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "is_distilled": False}))
    return folder


def test_a_base_model_runs_diffusers_cfg_with_its_defaults(tiny_base_dir, base_settings, flux2_loras):
    """klein's base models take CFG (4.0 by default, 50 steps): the engine's call is diffusers' own."""
    settings = base_settings.replace(model_id=str(tiny_base_dir), base_model_id=BASE_4B, local_lora_dir=flux2_loras)
    loaded = load_pipeline(settings)
    assert (loaded.defaults.guidance, loaded.defaults.guidance_kind) == (4.0, "cfg")
    with local_engine(loaded, settings, flux2_loras) as engine:
        guided = dataclasses.replace(request(LoraSpec("local:flux2_kohya.safetensors")), guidance=4.0)
        ours = pixels(generate(engine, guided).image)
        unguided = pixels(generate(engine, dataclasses.replace(guided, guidance=1.0)).image)
    reference = dit_image(
        Flux2KleinPipeline,
        tiny_base_dir,
        flux2_loras,
        "flux2_kohya.safetensors",
        components=("transformer",),
        guidance=4.0,
    )
    assert_images_close(ours, reference)
    # The tiny Qwen3's prompt and empty-prompt embeddings are close: CFG moves the image a little, but moves it.
    assert (ours != unguided).any()


# -- FLUX.1 and FLUX.2 told apart ----------------------------------------------------------------------------


def _shapes(folder: Path, name: str) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in load_file(folder / name).items()}


def test_every_flux2_naming_is_judged_flux2_and_every_flux1_naming_flux1(flux2_loras):
    for case in CASES:
        origin = judge_origin([], lambda c=case: ({}, _shapes(flux2_loras, c.file_name)))
        assert origin.families == (Family.FLUX2,) and origin.denoiser_dims == {56}, case.name
    for flux1 in FLUX1_CASES:
        origin = judge_origin([], lambda c=flux1: ({}, _shapes(flux2_loras, c.file_name)))
        assert Family.FLUX2 not in origin.families, flux1.name


def kohya_mlp_shapes(width: int, mlp_in: int, linear1: int) -> dict[str, tuple[int, ...]]:
    """A kohya LoRA over a double block's MLP input and a single block's linear1 only: names FLUX.1 and FLUX.2
    share."""
    shapes: dict[str, tuple[int, ...]] = {}
    for stem, rows in (("double_blocks_0_img_mlp_0", mlp_in), ("single_blocks_0_linear1", linear1)):
        shapes[f"lora_unet_{stem}.lora_down.weight"] = (4, width)
        shapes[f"lora_unet_{stem}.lora_up.weight"] = (rows, 4)
    return shapes


@pytest.mark.parametrize("width", [56, 3072, 4096])
def test_shared_bfl_names_are_told_apart_by_their_mlp_widths(width):
    """FLUX.2's SwiGLU widths (6x in, 9x fused in linear1) rule FLUX.1 out; FLUX.1's (4x, 7x) rule FLUX.2 out,
    at any width (FLUX.1 and klein 4B are both 3072 wide)."""
    flux2 = kohya_mlp_shapes(width, 6 * width, 9 * width)
    assert judge_origin([], lambda: ({}, flux2)).families == (Family.FLUX2,)
    flux1 = kohya_mlp_shapes(width, 4 * width, 7 * width)
    # BFL's blocks alone fit Chroma as well as FLUX.1 (Chroma kept FLUX.1's blocks: test_chroma.py).
    assert judge_origin([], lambda: ({}, flux1)).families == (Family.FLUX, Family.CHROMA)


@pytest.mark.parametrize("case", FLUX1_CASES[:4], ids=[c.name for c in FLUX1_CASES[:4]])
def test_a_flux1_lora_on_a_klein_pool_is_a_400_naming_the_family(flux2_engine, case):
    with pytest.raises(IncompatibleLoraError, match=r"trained for the flux family.*flux2") as caught:
        generate(flux2_engine, request(LoraSpec(f"local:{case.file_name}")))
    assert caught.value.status == 400


def test_a_klein_lora_on_a_flux1_pool_is_a_400_naming_the_family(loaded_flux, base_settings, flux2_loras):
    settings = base_settings.replace(local_lora_dir=flux2_loras, base_model_id=FLUX1)
    with local_engine(loaded_flux, settings, flux2_loras) as engine:
        for case in CASES:
            with pytest.raises(IncompatibleLoraError, match=r"trained for the flux2 family") as caught:
                engine.check_lora(LoraSpec(f"local:{case.file_name}"))
            assert caught.value.status == 400, case.name


def test_a_flux1_kohya_lora_carded_klein_is_refused_naming_the_layers_diffusers_would_drop(flux2_engine, flux2_loras):
    """Its card says klein, so no origin refuses it; diffusers' FLUX.2 converter would drop FLUX.1's modulation
    and CLIP layers with a warning: a 400 naming them instead."""
    with pytest.raises(IncompatibleLoraError, match=r"kohya layers .*(mod_lin|lora_te1_).* none of FLUX.2's"):
        convert_lora(load_file(flux2_loras / "flux_kohya.safetensors"), flux2_engine.loaded.pipe.transformer)


# -- wrong shapes, previews ----------------------------------------------------------------------------------


def test_a_klein_lora_whose_shapes_fit_nothing_is_refused_naming_the_layer(flux2_engine, loaded_flux2, pristine_flux2):
    with pytest.raises(IncompatibleLoraError, match=r"do not fit transformer\.transformer_blocks\.0\.attn\.to_") as e:
        flux2_engine.check_lora(LoraSpec("local:flux2_wide.safetensors"))
    assert e.value.status == 400 and "(56, 56)" in str(e.value)
    flux2_engine.restore_base_weights()
    assert_components_pristine(loaded_flux2.pipe, pristine_flux2, ("transformer",))


def test_previews_project_the_packed_latents(loaded_flux2, base_settings):
    assert FAMILY.preview.tiny_vae is None and FAMILY.preview.projection is LATENT_RGB
    assert len(LATENT_RGB.weights) == loaded_flux2.pipe.vae.config.latent_channels
    settings = base_settings.replace(base_model_id=MODEL_ID, preview_vae="auto", preview_every=1)
    frames = preview_frames(loaded_flux2, settings, request())
    # The VAE's 32 channels at its latent resolution: 64 px over the tiny VAE's 2x.
    assert [step for step, _ in frames] == [1, 2] and all(image.size == (32, 32) for _, image in frames)
