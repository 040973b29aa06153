"""The registry and what each family declares: its tiny pipeline, size presets, and lookups by base and family."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from engine.errors import SettingsError
from engine.families.registry import SERVED_FAMILIES, family_spec, served_specs, spec_for
from engine.families.tiny import TINY_SIDE
from engine.requests import ModelDefaults
from lora_catalog.bases import KNOWN_BASES
from lora_catalog.entries import Family

# Components diffusers' loader of the class names that the family's LoRAs never adapt: Chroma's loader is FLUX.1's
# (`FluxLoraLoaderMixin`, whose `text_encoder` is FLUX.1's CLIP), but Chroma's `text_encoder` is T5, whose parts
# diffusers' FLUX converter drops.
NOT_ADAPTED = {Family.CHROMA: {"text_encoder"}}
# Families whose real models share their hidden width, and so their tiny ones too (widths never tell them apart):
# Chroma's and FLUX.1's 3072.
SAME_WIDTH = {Family.CHROMA: Family.FLUX}


def encoders(spec, pipe) -> dict[str, torch.nn.Module]:
    return {c: getattr(pipe, c) for c in spec.components if c != spec.denoiser}


@pytest.mark.parametrize("family", SERVED_FAMILIES)
def test_each_tiny_pipeline_is_of_its_familys_class_with_the_declared_denoiser_and_components(tiny_pipes, family):
    spec = spec_for(family)
    pipe = tiny_pipes[family]
    assert type(pipe) is spec.pipeline_class
    assert spec.denoiser in spec.components
    # What a LoRA may change is what diffusers' own loader of the class loads LoRAs into (FLUX: not T5).
    # (Those the pipeline has: Wan's loader names a second transformer only its two-stage models have.)
    loadable = {m for m in spec.pipeline_class._lora_loadable_modules if getattr(pipe, m, None) is not None}
    loadable -= NOT_ADAPTED.get(family, set())
    assert set(spec.components) == loadable
    models = {name for name, model in pipe.components.items() if isinstance(model, torch.nn.Module)}
    assert {*spec.components, "vae"} <= models
    denoiser = getattr(pipe, spec.denoiser)
    assert spec.served_side(pipe) == TINY_SIDE
    widths = spec.signature.pipeline_widths(denoiser, encoders(spec, pipe))
    # Text widths where a LoRA may adapt a text encoder (Z-Image's loader adapts only its transformer).
    # (A two-stage Wan's components are its two transformers.)
    assert widths.denoiser and (widths.text or all(c.startswith(spec.denoiser) for c in spec.components))


def test_the_tiny_pipelines_have_widths_of_their_own(tiny_pipes):
    """So a LoRA's shapes tell the tiny ones apart, as they tell the real ones apart."""
    cross = {
        spec.family: spec.signature.pipeline_widths(getattr(tiny_pipes[spec.family], spec.denoiser), {}).denoiser
        for spec in served_specs()
    }
    for family, same in SAME_WIDTH.items():
        assert cross.pop(family) == cross[same]
    assert len(set(cross.values())) == len(cross)


def test_the_tiny_sd2_pipeline_has_sd2s_structure_and_runs(tiny_pipes):
    pipe = tiny_pipes[Family.SD2]
    assert isinstance(pipe.unet.down_blocks[0].attentions[0].proj_in, torch.nn.Linear)
    assert pipe.scheduler.config.prediction_type == "v_prediction"
    image = pipe("a cat", num_inference_steps=2, generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (TINY_SIDE, TINY_SIDE)


def test_same_seed_same_weights_for_every_family():
    for spec in served_specs():
        first, again = spec.build_tiny(3), spec.build_tiny(3)
        for component in (*spec.components, "vae"):
            pairs = zip(getattr(first, component).parameters(), getattr(again, component).parameters(), strict=True)
            assert all(torch.equal(a, b) for a, b in pairs), f"{spec.family}: {component}"


def test_lookups_by_base_and_by_family():
    for base in KNOWN_BASES:
        if base.family in SERVED_FAMILIES:
            assert family_spec(base.repo_id) is spec_for(base.family)
    assert family_spec("RunDiffusion/Juggernaut-XL-v10").family is Family.SDXL  # a fine-tune series
    assert family_spec("black-forest-labs/FLUX.1-schnell").family is Family.FLUX
    with pytest.raises(
        SettingsError,
        match=r"an unknown base; accepted: a base of the SDXL, SD 1.5, SD 2.x, FLUX.1, Z-Image, FLUX.2 \[klein\], "
        r"Qwen-Image, FLUX.1 Kontext, FLUX.2 \[dev\], Qwen-Image-Edit, Qwen-Image-Edit-2509/2511, Wan I2V, "
        r"Wan, Wan 2.2 A14B, Wan 2.2 I2V A14B, Chroma, LTX-2 or Krea 2 family",
    ):
        family_spec("me/mystery")
    with pytest.raises(ValueError, match=r"no pool serves the unknown family; served: sdxl, sd15, sd2, flux"):
        spec_for(Family.UNKNOWN)


def test_the_registry_and_settings_import_no_torch():
    """`engine.settings` reads the served families here at start-up; the family modules load on first use."""
    code = "import sys, engine.settings, engine.families.registry; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"


def test_size_presets_are_each_familys_buckets_scaled_to_the_served_side():
    sdxl, sd15, sd2, flux = (spec_for(f) for f in (Family.SDXL, Family.SD15, Family.SD2, Family.FLUX))
    presets = flux.size_presets(1024, 1536)
    assert presets[:1] == ((1024, 1024),) and {(1344, 768), (768, 1344)} <= set(presets)
    presets = sdxl.size_presets(1024, 1536)
    assert presets[0] == (1024, 1024) and (1216, 832) in presets and len(presets) == 7
    assert sdxl.size_presets(1024, 1024) == ((1024, 1024),)
    assert sd15.size_presets(512, 1024) == ((512, 512), (576, 448), (448, 576), (640, 384), (384, 640))
    assert sd2.size_presets(768, 1536) == ((768, 768), (896, 640), (640, 896), (1024, 576), (576, 1024))
    # SD 2.1's 512 px base repos get SD 1.5's presets, as both are SDXL's buckets scaled to 512.
    assert sd2.size_presets(512, 1024) == sd15.size_presets(512, 1024) == sdxl.size_presets(512, 1024)


def test_a_loaded_pipeline_carries_its_presets_in_its_defaults_across_json(loaded, loaded_sd15):
    tiny = ["64x64", "128x128", "256x256", "128x64", "64x128", "256x128", "128x256"]
    assert [f"{w}x{h}" for w, h in loaded.defaults.sizes] == tiny
    assert loaded_sd15.defaults.sizes == loaded.defaults.sizes
    # As the cluster and a remote Space send them: JSON lists, read back as the same frozen defaults.
    sent = json.loads(json.dumps(dataclasses.asdict(loaded.defaults)))
    assert ModelDefaults(**sent) == loaded.defaults


def test_each_spec_holds_its_familys_identity_and_its_claims_are_the_identitys_only():
    from families import IDENTITIES

    for spec in served_specs():
        assert spec.identity is IDENTITIES[spec.family]
        # The names a family claims are declared once, in its identity's row; the signature holds shapes only.
        assert not hasattr(spec.signature, "claims")


def test_a_family_is_two_stage_in_its_identity_exactly_when_its_spec_names_a_second_stage():
    """The catalogue reads `FamilyIdentity.two_stage` (a Civitai version may be a pair only on such a base)."""
    said = {spec.family: spec.identity.two_stage for spec in served_specs()}
    assert said == {spec.family: spec.second_stage is not None for spec in served_specs()}
    assert {family for family, two in said.items() if two} == {Family.WAN22, Family.WAN22_I2V}
