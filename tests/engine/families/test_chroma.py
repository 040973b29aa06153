"""Chroma on the tiny Chroma pipeline: its own pipeline, widths and claims; BFL names with `lora_A`/`lora_B`, which
diffusers' loader ignores silently, loaded (its namings against diffusers' fuse and the base bit-exact after swaps:
test_swaps.py; four and more clients on its pool: tests/engine/pools/test_pools_mixed.py); a FLUX.1 LoRA told
from a Chroma one by its card, its metadata and the layers FLUX.1 has and Chroma lacks, both ways; image-to-image
and inpainting through diffusers' Chroma pipelines."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from diffusers import ChromaImg2ImgPipeline, ChromaInpaintPipeline, ChromaPipeline
from safetensors.torch import load_file

from engine.errors import IncompatibleLoraError
from engine.families.chroma import FAMILY, convert_lora
from engine.families.origin import check_origin, judge_origin
from engine.families.registry import family_spec
from engine.pools.routing import pick_pool
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from families.chroma import BASE_ID, FLASH_ID, MODEL_ID
from families.flux import MODEL_ID as FLUX_MODEL_ID
from lora_catalog.bases import KNOWN_BASES, base_from_metadata, family_from_keys, family_from_metadata
from lora_catalog.entries import Family
from lora_catalog.sft_header import read_header
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.chroma import (
    CASES,
    ChromaCase,
    chroma_file,
    kohya_diffusers_named,
    write_chroma_loras,
    write_flux_loras_for_chroma,
)
from tests.support.dit import PROMPT, diffusers_image, local_engine, served_pools
from tests.support.flux import assert_same_updates
from tests.support.image_inputs import input_image, input_mask
from tests.support.images import assert_images_close, level_difference

WITH_MODULATIONS, ATTENTION_ONLY = "flux1_with_modulations.safetensors", "flux1_attention.safetensors"


def request(*loras: LoraSpec, guidance: float = 3.0, **fields: Any) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "guidance": guidance, "width": 64, "height": 64, "seed": 7} | fields
    return GenerateRequest(loras=tuple(loras), **values)


@pytest.fixture(scope="module")
def chroma_loras(loaded_chroma, loaded_flux, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("chroma-loras")
    write_chroma_loras(loaded_chroma.pipe, folder)
    write_flux_loras_for_chroma(loaded_flux.pipe, folder)
    # BFL's names with `lora_A`/`lora_B` over Chroma's modulation network, which diffusers' converter cannot read.
    tensors, _, _ = chroma_file(loaded_chroma.pipe.transformer, ChromaCase("x", "comfy", guidance=True, seed=68))
    renamed = {k.replace(".lora_down.", ".lora_A.").replace(".lora_up.", ".lora_B."): v for k, v in tensors.items()}
    save_lora(folder / "chroma_bfl_guidance.safetensors", renamed)
    # kohya's diffusers-named form over every layer: diffusers places a block's feed-forward on the block itself.
    _, _, twin = chroma_file(loaded_chroma.pipe.transformer, ChromaCase("x", "peft", seed=69))
    save_lora(folder / "chroma_kohya_diffusers_ff.safetensors", kohya_diffusers_named(twin))
    # The FLUX.1 LoRA with modulations, its metadata claiming Chroma (a mislabelled file).
    save_lora(
        folder / "flux1_as_chroma.safetensors",
        load_file(folder / WITH_MODULATIONS),
        {"modelspec.architecture": "chroma/lora"},
    )
    return folder


@pytest.fixture
def chroma_engine(family_engine, chroma_loras):
    return family_engine(Family.CHROMA, chroma_loras)


def shapes(folder: Path, name: str) -> dict[str, tuple[int, ...]]:
    return {key: info.shape for key, info in read_header(folder / name).tensors.items()}


# -- the family --------------------------------------------------------------------------------------------------


def test_the_tiny_chroma_pipeline_has_chromas_structure(loaded_chroma):
    pipe = loaded_chroma.pipe
    assert type(pipe) is ChromaPipeline and loaded_chroma.family is FAMILY
    assert all(family_spec(base) is FAMILY for base in (MODEL_ID, BASE_ID, FLASH_ID))
    # The catalogue's base filter lists each.
    assert {b.repo_id for b in KNOWN_BASES if b.family is Family.CHROMA} == {MODEL_ID, BASE_ID, FLASH_ID}
    # T5 alone (no CLIP), never adapted; a modulation network in place of FLUX.1's per-block modulations.
    assert loaded_chroma.components == ("transformer",) and type(pipe.text_encoder).__name__ == "T5EncoderModel"
    assert not hasattr(pipe, "text_encoder_2") and FAMILY.memory.host_components == ("text_encoder",)
    modules = dict(pipe.transformer.named_modules())
    assert "distilled_guidance_layer.in_proj" in modules
    assert not any(name.endswith(("norm1.linear", "norm.linear", "norm_out.linear")) for name in modules)
    defaults = loaded_chroma.defaults
    assert (defaults.guidance, defaults.guidance_kind, defaults.negative_prompt) == (3.0, "cfg", True)
    assert defaults.modes == ("text-to-image", "image-to-image", "inpainting")


def test_chroma1_hds_card_defaults_and_call():
    defaults = FAMILY.defaults(SimpleNamespace(vae_scale_factor=8))
    assert (defaults.steps, defaults.guidance, defaults.side_multiple) == (40, 3.0, 16)
    arguments = FAMILY.call_arguments(CheckedRequest(prompt="x", negative_prompt="blurry", guidance=3.0, width=64))
    assert arguments["negative_prompt"] == "blurry" and arguments["guidance_scale"] == 3.0
    assert FAMILY.size_presets(1024, 1344)[:3] == ((1024, 1024), (1152, 896), (896, 1152))


# -- BFL names with lora_A / lora_B ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in CASES if c.fmt.startswith("bfl")], ids=lambda c: c.name)
def test_bfl_names_with_lora_a_and_b_load_where_diffusers_ignores_them(
    case, chroma_loras, loaded_chroma, tiny_chroma_dir
):
    file = load_file(chroma_loras / case.file_name)
    assert not any(k.startswith("transformer.") for k in ChromaPipeline.lora_state_dict(dict(file)))
    # diffusers' own loader: no error, no change.
    ignored = diffusers_image(
        ChromaPipeline, tiny_chroma_dir, chroma_loras, case.file_name, components=("transformer",), guidance=3.0
    )
    base = diffusers_image(
        ChromaPipeline, tiny_chroma_dir, chroma_loras, None, components=("transformer",), guidance=3.0
    )
    assert ignored.tobytes() == base.tobytes()
    # Ours: exactly diffusers' reading of the same factors in its own names.
    ours, _ = convert_lora(dict(file), loaded_chroma.pipe.transformer)
    twin = load_file(chroma_loras / case.twin_name)
    assert_same_updates(ours, twin)


def test_a_bfl_named_modulation_network_diffusers_cannot_read_is_refused_by_name(
    chroma_engine, loaded_chroma, pristine_chroma
):
    with pytest.raises(IncompatibleLoraError, match=r"distilled_guidance_layer") as caught:
        chroma_engine.check_lora(LoraSpec("local:chroma_bfl_guidance.safetensors"))
    assert caught.value.status == 400


def test_fals_base_model_prefix_loads_where_diffusers_raises_on_chroma(chroma_loras, loaded_chroma):
    """PEFT's `base_model.model.` over BFL's names (fal's trainer): diffusers' converter reads it only as a whole
    FLUX.1 [dev] (every modulation, Chroma has none) and raises; ours is diffusers' reading of its twin (its image
    against diffusers' fuse: test_swaps.py)."""
    (case,) = [c for c in CASES if c.fmt == "fal"]
    file = load_file(chroma_loras / case.file_name)
    with pytest.raises(KeyError, match="img_mod"):
        ChromaPipeline.lora_state_dict(dict(file))
    ours, _ = convert_lora(dict(file), loaded_chroma.pipe.transformer)
    assert_same_updates(ours, load_file(chroma_loras / case.twin_name))


def test_kohya_diffusers_names_diffusers_misplaces_are_refused_by_name(chroma_engine):
    """kohya's `lora_transformer_` over a block's MLP (`proj_mlp`, `ff`): diffusers' converter names it as the block
    itself (no layer), so the file is refused naming those tensors, never run in part. Which of two tensors renamed
    alike is overwritten (and so named) follows diffusers' iteration, so the pattern takes either."""
    pattern = r"does not read .*: lora_transformer_single_transformer_blocks_\d+_proj_(mlp|out)\.lora_"
    with pytest.raises(IncompatibleLoraError, match=pattern) as caught:
        chroma_engine.check_lora(LoraSpec("local:chroma_kohya_diffusers_ff.safetensors"))
    assert caught.value.status == 400


# -- FLUX.1 and Chroma: card, metadata, tensors -------------------------------------------------------------------


def test_the_card_tells_flux1_from_chroma_both_ways():
    flux = judge_origin([FLUX_MODEL_ID], lambda: pytest.fail("the card decides"))
    with pytest.raises(IncompatibleLoraError, match=r"made for black-forest-labs/FLUX.1-dev \(flux\)"):
        check_origin("LoRA 'x'", flux, MODEL_ID)
    chroma = judge_origin([BASE_ID], lambda: pytest.fail("the card decides"))
    assert chroma.families == (Family.CHROMA,)
    with pytest.raises(IncompatibleLoraError, match=r"made for lodestones/Chroma1-Base \(chroma\)"):
        check_origin("LoRA 'x'", chroma, FLUX_MODEL_ID)
    # Made on Chroma1-Base (where trainers train), run on HD: a checkpoint of the same architecture, with a note.
    assert "made for Chroma1-Base" in (check_origin("LoRA 'x'", chroma, MODEL_ID) or "")


def test_the_metadata_tells_flux1_from_chroma_both_ways():
    chroma = {"modelspec.architecture": "chroma/lora", "ss_sd_model_name": "Chroma1-Base.safetensors"}
    assert family_from_metadata(chroma) is Family.CHROMA and base_from_metadata(chroma, Family.CHROMA) == BASE_ID
    assert family_from_metadata({"ss_sd_model_name": "chroma-unlocked-v48.safetensors"}) is Family.CHROMA
    origin = judge_origin(["me/unknown"], lambda: (chroma, {}))
    with pytest.raises(IncompatibleLoraError, match=r"trained for the chroma family"):
        check_origin("LoRA 'x'", origin, FLUX_MODEL_ID)
    flux = judge_origin(["me/unknown"], lambda: ({"ss_base_model_version": "flux1"}, {}))
    with pytest.raises(IncompatibleLoraError, match=r"trained for the flux family"):
        check_origin("LoRA 'x'", flux, MODEL_ID)


def test_the_tensors_tell_flux1_from_chroma_by_the_layers_only_one_has(chroma_loras, tiny_pipes):
    pools = served_pools(tiny_pipes)
    by_family = {p.family: i for i, p in enumerate(pools)}
    # FLUX.1's modulations (img_mod, txt_mod, modulation), which Chroma pruned: FLUX.1's alone.
    flux = judge_origin([], lambda: ({}, shapes(chroma_loras, WITH_MODULATIONS)))
    assert flux.families == (Family.FLUX,) and pick_pool("x", flux, pools) == by_family[Family.FLUX]
    # Chroma's modulation network: Chroma's alone, in diffusers' names, beside FLUX.1's 32-wide pool.
    chroma = judge_origin([], lambda: ({}, shapes(chroma_loras, "chroma_peft.safetensors")))
    assert chroma.families == (Family.CHROMA,) and pick_pool("x", chroma, pools) == by_family[Family.CHROMA]
    assert family_from_keys(shapes(chroma_loras, "chroma_peft.safetensors")) is Family.CHROMA
    # BFL's blocks alone (attention, MLPs): both architectures' names and widths; both stay, and a Chroma pool
    # warns which.
    for name in (ATTENTION_ONLY, "chroma_kohya_linear1.safetensors"):
        both = judge_origin([], lambda n=name: ({}, shapes(chroma_loras, n)))
        assert set(both.families) == {Family.FLUX, Family.CHROMA}, name
        assert "which fit FLUX.1 and Chroma alike" in (check_origin("LoRA 'x'", both, MODEL_ID) or "")


def test_a_flux1_lora_with_modulations_is_refused_on_chroma_and_one_without_runs_with_a_warning(chroma_engine):
    with pytest.raises(
        IncompatibleLoraError, match=r"trained for the flux family; this Space serves lodestones/Chroma1-HD"
    ):
        chroma_engine.check_lora(LoraSpec(f"local:{WITH_MODULATIONS}"))
    result = generate(chroma_engine, request(LoraSpec(f"local:{ATTENTION_ONLY}")))
    assert any("FLUX.1 and Chroma alike" in w for w in result.warnings)


def test_a_flux1_lora_declared_chroma_is_refused_naming_the_modulation_layers_chroma_lacks(chroma_engine):
    with pytest.raises(
        IncompatibleLoraError, match=r"(norm1|norm1_context|norm)\.linear, which the served pipeline lacks"
    ):
        chroma_engine.check_lora(LoraSpec("local:flux1_as_chroma.safetensors"))


def test_a_chroma_lora_is_refused_on_a_flux1_engine(loaded_flux, base_settings, chroma_loras):
    settings = base_settings.replace(local_lora_dir=chroma_loras, base_model_id=FLUX_MODEL_ID)
    refused = pytest.raises(IncompatibleLoraError, match=r"trained for the chroma family")
    with local_engine(loaded_flux, settings, chroma_loras) as engine, refused:
        engine.check_lora(LoraSpec("local:chroma_peft.safetensors"))


# -- image-to-image and inpainting ----------------------------------------------------------------------------------


def diffusers_mode(mode_class: Any, tiny_dir: Path, folder: Path, call: dict[str, Any]) -> Any:
    """diffusers' own image: ChromaPipeline from `tiny_dir`, the peft case fused into its transformer, `mode_class`
    from its components, seed 7. diffusers 0.42.1's inpainting call reads FLUX.1's `guidance_embeds` from the
    transformer's config, which Chroma's lacks (an AttributeError on every call): the reference's own transformer
    states it (False: Chroma has no guidance embedding), as the family's pipeline does (engine.families.chroma)."""
    pipe: Any = ChromaPipeline.from_pretrained(tiny_dir)
    pipe.load_lora_weights(str(folder), weight_name=CASES[0].file_name, adapter_name="a0")
    pipe.fuse_lora(components=["transformer"])
    pipe.transformer.register_to_config(guidance_embeds=False)
    mode = mode_class.from_pipe(pipe)
    mode.set_progress_bar_config(disable=True)
    return mode(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(7), **call).images[0]


def test_diffusers_chroma_inpainting_fails_on_chromas_own_config(tiny_chroma_dir):
    """Why the family's inpainting class states `guidance_embeds` (fails once diffusers fixes it: then drop it)."""
    pipe: Any = ChromaInpaintPipeline.from_pretrained(tiny_chroma_dir)
    pipe.set_progress_bar_config(disable=True)
    call = {"image": input_image().to_pil(), "mask_image": input_mask().to_pil(), "num_inference_steps": 2}
    with pytest.raises(AttributeError, match="guidance_embeds"):
        pipe(prompt=PROMPT, width=64, height=64, **call)


@pytest.mark.parametrize("mode", ["image-to-image", "inpainting"])
def test_each_image_mode_equals_diffusers_chroma_pipeline(mode, chroma_engine, chroma_loras, tiny_chroma_dir):
    inpainting = mode == "inpainting"
    lora = LoraSpec(f"local:{CASES[0].file_name}")
    fields = {"image": input_image(), "mask_image": input_mask() if inpainting else None, "strength": 0.6, "steps": 5}
    ours = generate(chroma_engine, request(lora, **fields))
    assert ours.request.mode == mode and ours.image.size == (64, 64)
    call: dict[str, Any] = {"image": input_image().to_pil(), "strength": 0.6, "num_inference_steps": 5}
    call |= {"guidance_scale": 3.0, "width": 64, "height": 64}
    if inpainting:
        call["mask_image"] = input_mask().to_pil()
    mode_class = ChromaInpaintPipeline if inpainting else ChromaImg2ImgPipeline
    reference = diffusers_mode(mode_class, tiny_chroma_dir, chroma_loras, call)
    assert_images_close(ours.image, reference, mode)
    plain = generate(chroma_engine, request(**fields))
    assert level_difference(plain.image, ours.image) > 2
