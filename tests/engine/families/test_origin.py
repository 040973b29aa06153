"""The one origin judgement: card, metadata, then names and shapes; and what preparation and routing make of it."""

from __future__ import annotations

import pytest
import torch

from engine.errors import IncompatibleLoraError
from engine.families.origin import LoraOrigin, check_origin, declared_bases_from_tags, judge_origin
from engine.families.registry import SERVED_FAMILIES, served_specs, spec_for
from engine.pools.routing import PoolInfo, pick_pool
from lora_catalog.entries import Family
from serving.demo.synthetic import TEXT_ATTENTION, UNET_ATTENTION, find_targets, make_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from tests.support import krea2, qwen_image, wan
from tests.support.chroma import ChromaCase, chroma_file
from tests.support.flux2 import factors as flux2_factors
from tests.support.flux2 import lora_file as flux2_lora_file
from tests.support.zimage import factors, lora_file

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
SD2 = "stabilityai/stable-diffusion-2-1"
FLUX = "black-forest-labs/FLUX.1-dev"
ZIMAGE = "Tongyi-MAI/Z-Image-Turbo"
FLUX2 = "black-forest-labs/FLUX.2-klein-4B"
QWEN_IMAGE = "Qwen/Qwen-Image"
KONTEXT = "black-forest-labs/FLUX.1-Kontext-dev"
FLUX2_DEV = "black-forest-labs/FLUX.2-dev"
BASES = {
    Family.SDXL: SDXL,
    Family.SD15: SD15,
    Family.SD2: SD2,
    Family.FLUX: FLUX,
    Family.ZIMAGE: ZIMAGE,
    Family.FLUX2: FLUX2,
    Family.QWEN_IMAGE: QWEN_IMAGE,
}
BASES[Family.FLUX_KONTEXT] = KONTEXT
BASES[Family.FLUX2_DEV] = FLUX2_DEV
BASES[Family.QWEN_IMAGE_EDIT] = "Qwen/Qwen-Image-Edit"
BASES[Family.QWEN_IMAGE_EDIT_PLUS] = "Qwen/Qwen-Image-Edit-2509"
BASES[Family.WAN] = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
BASES[Family.WAN_I2V] = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"
BASES[Family.WAN22] = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
BASES[Family.WAN22_I2V] = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
BASES[Family.CHROMA] = "lodestones/Chroma1-HD"
BASES[Family.LTX2] = "Lightricks/LTX-2"
BASES[Family.KREA2] = "krea/Krea-2-Turbo"
# FLUX.1 Kontext's and Qwen-Image-Edit's LoRAs have FLUX.1's and Qwen-Image's names and widths: only what they
# declare tells them (test_flux_kontext.py, test_qwen_image_edit.py).
EDITS = (Family.FLUX_KONTEXT, Family.QWEN_IMAGE_EDIT, Family.QWEN_IMAGE_EDIT_PLUS)
BY_TENSORS = [f for f in SERVED_FAMILIES if f not in EDITS]
# The kohya metadata each family's trainer writes (sd-scripts' `ss_base_model_version`; musubi-tuner's Z-Image).
KOHYA_VERSIONS = {
    Family.SDXL: "sdxl_base_v1-0",
    Family.SD15: "sd_v1",
    Family.SD2: "sd_v2",
    Family.FLUX: "flux1",
    Family.ZIMAGE: "zimage",
    Family.FLUX2: "flux2",
    Family.QWEN_IMAGE: "qwen_image",
    Family.FLUX_KONTEXT: "flux_kontext",
    Family.FLUX2_DEV: "flux_2_dev",
    Family.QWEN_IMAGE_EDIT: "qwen_image_edit",
    Family.QWEN_IMAGE_EDIT_PLUS: "qwen_image_edit_plus",
    Family.WAN: "wan2.1",
    Family.WAN_I2V: "wan2.1-i2v",
    Family.WAN22: "wan2.2-t2v-a14b",
    Family.WAN22_I2V: "wan2.2-i2v-a14b",
    Family.CHROMA: "chroma",
    Family.LTX2: "ltx-2",
    Family.KREA2: "krea2",
}
KOHYA_NAMES = {Family.SDXL: "sdxl", Family.SD15: "sd1", Family.SD2: "sd1"}


def unread() -> tuple[dict, dict]:
    raise AssertionError("the file must not be read when the card decides")


def shapes_of(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in tensors.items()}


def lora_for(pipe, family: Family, fmt: str) -> dict[str, tuple[int, ...]]:
    """A LoRA made for a tiny pipeline of `family` (denoiser and text-encoder attention), as names and shapes."""
    if family is Family.FLUX:
        layers = flux_layers(pipe.transformer, pipe.text_encoder)
        return shapes_of(make_flux_lora(layers, rank=2, seed=5).file("peft" if fmt == "peft" else "kohya")[0])
    if family is Family.ZIMAGE:
        return shapes_of(
            lora_file(factors(pipe.transformer, rank=2, seed=5), "peft" if fmt == "peft" else "kohya", 2.0)
        )
    if family in (Family.FLUX2, Family.FLUX2_DEV):
        made = flux2_factors(pipe.transformer, rank=2, seed=5)
        return shapes_of(flux2_lora_file(made, "peft" if fmt == "peft" else "aitk"))
    if family is Family.QWEN_IMAGE:
        made = qwen_image.factors(pipe.transformer, rank=2, seed=5)
        return shapes_of(qwen_image.lora_file(made, "peft" if fmt == "peft" else "kohya", 2.0))
    if family in (Family.WAN, Family.WAN_I2V, Family.WAN22, Family.WAN22_I2V):
        modules = wan.I2V_MODULES[:24] if family is Family.WAN_I2V else wan.MODULES
        made = wan.factors(pipe.transformer, modules, rank=2, seed=5)
        return shapes_of(wan.lora_file(made, "peft" if fmt == "peft" else "musubi", 2.0))
    if family is Family.CHROMA:
        # With its modulation network, the layer only Chroma has (BFL's blocks alone fit FLUX.1 alike:
        # test_chroma.py).
        return shapes_of(chroma_file(pipe.transformer, ChromaCase("x", fmt, guidance=True, seed=5))[0])
    if family is Family.LTX2:
        from tests.support import ltx2

        made = ltx2.factors(pipe, ltx2.TRANSFORMER + ltx2.CONNECTORS, rank=2, seed=5)
        return shapes_of(ltx2.lora_file(made, "peft" if fmt == "peft" else "original"))
    if family is Family.KREA2:
        made = krea2.factors(pipe.transformer, rank=2, seed=5)
        return shapes_of(krea2.lora_file(made, "peft" if fmt == "peft" else "kohya", 2.0))
    spec = spec_for(family)
    components = {c: getattr(pipe, c) for c in spec.components}
    patterns = {c: UNET_ATTENTION if c == spec.denoiser else TEXT_ATTENTION for c in components}
    targets = find_targets(components, patterns)
    return shapes_of(make_lora(targets, rank=2, seed=5, fmt=fmt, kohya_names=KOHYA_NAMES[family]))


def pools_of(tiny_pipes) -> list[PoolInfo]:
    infos = []
    for spec in served_specs():
        pipe = tiny_pipes[spec.family]
        encoders = {c: getattr(pipe, c) for c in spec.components if c != spec.denoiser}
        widths = spec.signature.pipeline_widths(getattr(pipe, spec.denoiser), encoders)
        infos.append(PoolInfo(BASES[spec.family], spec.family, widths.denoiser, widths.text))
    return infos


# -- card --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", SERVED_FAMILIES)
def test_a_card_naming_a_known_base_decides_without_reading_the_file(family):
    origin = judge_origin([BASES[family], "me/unknown-tune"], unread)
    assert origin == LoraOrigin((BASES[family], "me/unknown-tune"), (family,), "card")
    assert check_origin("LoRA 'x'", origin, BASES[family]) is None
    other = next(f for f in SERVED_FAMILIES if f is not family)
    with pytest.raises(IncompatibleLoraError, match=rf"made for {BASES[family]}, me/unknown-tune \({family}\)"):
        check_origin("LoRA 'x'", origin, BASES[other])


def test_hub_tags_name_bases_as_the_card_does():
    tags = ["lora", f"base_model:adapter:{SDXL}", f"base_model:{SD15}", "base_model:finetune:me/x", "license:mit"]
    assert declared_bases_from_tags(tags) == (SDXL, SD15)


# -- metadata ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", SERVED_FAMILIES)
def test_kohya_metadata_decides_when_the_card_names_no_known_base(family):
    metadata = {"ss_base_model_version": KOHYA_VERSIONS[family]}
    origin = judge_origin(["me/unknown-tune"], lambda: (metadata, {}))
    assert (origin.families, origin.how, origin.bases) == ((family,), "metadata", ())
    assert check_origin("LoRA 'x'", origin, BASES[family]) is None
    other = next(f for f in SERVED_FAMILIES if f is not family)
    with pytest.raises(IncompatibleLoraError, match=rf"trained for the {family} family \(its card names me/unknown"):
        check_origin("LoRA 'x'", origin, BASES[other])


def test_metadata_of_an_architecture_we_do_not_know_leaves_the_judgement_to_the_tensors(tiny_pipes):
    shapes = lora_for(tiny_pipes[Family.SDXL], Family.SDXL, "kohya")
    refiner = {"modelspec.architecture": "stable-diffusion-xl-v1-refiner/lora"}
    origin = judge_origin([], lambda: (refiner, shapes))
    assert (origin.families, origin.how) == ((Family.SDXL,), "shapes")


# -- names and shapes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["kohya", "peft"])
@pytest.mark.parametrize("family", BY_TENSORS)
def test_names_and_shapes_find_each_family_and_its_pool(tiny_pipes, family, fmt):
    shapes = lora_for(tiny_pipes[family], family, fmt)
    origin = judge_origin([], lambda: ({}, shapes))
    assert origin.how == "shapes" and family in origin.families
    pools = pools_of(tiny_pipes)
    assert pools[pick_pool("LoRA 'x'", origin, pools)].family is family


def test_sd1_and_sd2_loras_share_their_names_so_only_widths_tell_them_apart(tiny_pipes):
    for family in (Family.SD15, Family.SD2):
        origin = judge_origin([], lambda f=family: ({}, lora_for(tiny_pipes[f], f, "kohya")))
        # The ambiguity, as the judgement reports it: both families stay.
        assert origin.families == (Family.SD15, Family.SD2)
        # Preparation warns on either family's pool, and refuses it on SDXL's.
        assert "judged by its tensors alone" in (check_origin("LoRA 'x'", origin, SD15) or "")
        assert "judged by its tensors alone" in (check_origin("LoRA 'x'", origin, SD2) or "")
        with pytest.raises(IncompatibleLoraError, match=r"trained for the sd15 or sd2 family; this Space serves"):
            check_origin("LoRA 'x'", origin, SDXL)
        # Routing: the widths pick the one pool whose pipeline the factors fit.
        pools = pools_of(tiny_pipes)
        assert pools[pick_pool("LoRA 'x'", origin, pools)].family is family


def test_a_file_that_shows_nothing_is_judged_by_no_family_and_warned_about():
    origin = judge_origin([], lambda: ({"format": "pt"}, {"something.weight": (4, 4)}))
    assert (origin.families, origin.how) == ((), "shapes")
    assert check_origin("LoRA 'x'", origin, SDXL) == (
        "LoRA 'x' declares no base model we know; it is judged by its tensors alone"
    )
