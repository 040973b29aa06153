"""Known base models and how to tell which family a LoRA was trained for.

A LoRA only fits a base of its own family (SDXL LoRAs fit SDXL fine-tunes, not
SD 1.5 ones). The table is deliberately small: bases the Space may serve and
the well-known fine-tunes LoRA cards name. Refiners and architectures that
look alike but are not LoRA-compatible (SDXL refiner, Playground v2.5) are
left out on purpose, so they come out as `Family.UNKNOWN`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .entries import Family

__all__ = [
    "DEFAULT_BASE",
    "ILLUSTRIOUS_BASE",
    "KNOWN_BASES",
    "NOOBAI_BASE",
    "PONY_BASE",
    "KnownBase",
    "family_from_keys",
    "family_from_metadata",
    "family_of_base",
]

DEFAULT_BASE = "stabilityai/stable-diffusion-xl-base-1.0"


@dataclass(frozen=True)
class KnownBase:
    """A base model the UI can offer in its base filter."""

    repo_id: str
    display_name: str
    family: Family


# SDXL fine-tunes that are ecosystems of their own (Civitai files LoRAs under "Pony", "Illustrious" and "NoobAI"
# as base models, most of its SDXL-shaped ones): the repo id standing for each (its authors' own), SDXL-shaped.
# `MODELS` may name one as the BASE of a pool serving that fine-tune; else their LoRAs run on the SDXL pool.
PONY_BASE = "AstraliteHeart/pony-diffusion-v6"
ILLUSTRIOUS_BASE = "OnomaAIResearch/Illustrious-xl-early-release-v0"
NOOBAI_BASE = "Laxhar/noobai-XL-1.1"

KNOWN_BASES: tuple[KnownBase, ...] = (
    KnownBase(DEFAULT_BASE, "SDXL 1.0", Family.SDXL),
    KnownBase("stabilityai/sdxl-turbo", "SDXL Turbo", Family.SDXL),
    KnownBase("RunDiffusion/Juggernaut-XL-v9", "Juggernaut XL v9", Family.SDXL),
    KnownBase("SG161222/RealVisXL_V4.0", "RealVisXL V4.0", Family.SDXL),
    KnownBase("Lykon/dreamshaper-xl-1-0", "DreamShaper XL 1.0", Family.SDXL),
    KnownBase("cagliostrolab/animagine-xl-3.1", "Animagine XL 3.1", Family.SDXL),
    KnownBase(PONY_BASE, "Pony Diffusion V6 XL", Family.SDXL),
    KnownBase(ILLUSTRIOUS_BASE, "Illustrious XL", Family.SDXL),
    KnownBase(NOOBAI_BASE, "NoobAI XL", Family.SDXL),
    KnownBase("stable-diffusion-v1-5/stable-diffusion-v1-5", "Stable Diffusion 1.5", Family.SD15),
    KnownBase("runwayml/stable-diffusion-v1-5", "Stable Diffusion 1.5 (runwayml)", Family.SD15),
    KnownBase("CompVis/stable-diffusion-v1-4", "Stable Diffusion 1.4", Family.SD15),
    KnownBase("stabilityai/stable-diffusion-2-1", "Stable Diffusion 2.1", Family.SD2),
    KnownBase("stabilityai/stable-diffusion-2-1-base", "Stable Diffusion 2.1 base", Family.SD2),
    KnownBase("black-forest-labs/FLUX.1-dev", "FLUX.1 [dev]", Family.FLUX),
    KnownBase("black-forest-labs/FLUX.1-schnell", "FLUX.1 [schnell]", Family.FLUX),
    KnownBase("Tongyi-MAI/Z-Image-Turbo", "Z-Image Turbo", Family.ZIMAGE),
)

_BY_ID: dict[str, Family] = {b.repo_id.lower(): b.family for b in KNOWN_BASES}
# Fine-tune series publish one repo per version; every version keeps the SDXL architecture.
_SERIES: tuple[tuple[str, Family], ...] = (
    ("rundiffusion/juggernaut-xl-", Family.SDXL),
    ("sg161222/realvisxl_", Family.SDXL),
    ("cagliostrolab/animagine-xl-", Family.SDXL),
)

# Z-Image's transformer lists at the top of its names (diffusers', ComfyUI's and kohya's forms); CLIP's
# `encoder.layers.N` never starts a name.
_ZIMAGE_BLOCKS = re.compile(
    r"^(transformer\.|diffusion_model\.|lora_unet_)?(layers|noise_refiner|context_refiner)[._]\d+[._]"
)
_UNET_BLOCKS = ("down_blocks", "up_blocks", "mid_block", "input_blocks", "output_blocks", "middle_block")

# kohya's `ss_base_model_version` values (sd-scripts library/sai_model_spec.py and train_util.py).
_SS_VERSIONS: tuple[tuple[str, Family], ...] = (
    ("sdxl", Family.SDXL),
    ("sd_v1", Family.SD15),
    ("sd_v2", Family.SD2),
    ("flux", Family.FLUX),
    ("sd3", Family.UNKNOWN),
    # Z-Image trainers (musubi-tuner, ai-toolkit) spell the architecture with or without a separator.
    ("z-image", Family.ZIMAGE),
    ("z_image", Family.ZIMAGE),
    ("zimage", Family.ZIMAGE),
)
# modelspec.architecture prefixes (Stability's ModelSpec); the refiner is a separate, incompatible net.
_ARCHITECTURES: tuple[tuple[str, Family], ...] = (
    ("stable-diffusion-xl-v1-refiner", Family.UNKNOWN),
    ("stable-diffusion-xl", Family.SDXL),
    ("stable-diffusion-v1", Family.SD15),
    ("stable-diffusion-v2", Family.SD2),
    ("stable-diffusion-v3", Family.UNKNOWN),
    ("stable-diffusion-3", Family.UNKNOWN),
    ("flux-1", Family.FLUX),
    ("flux.1", Family.FLUX),
    ("z-image", Family.ZIMAGE),
    ("z_image", Family.ZIMAGE),
    ("zimage", Family.ZIMAGE),
)
# Checkpoint file names as trainers record them in `ss_sd_model_name`; a best-effort guess.
_MODEL_NAMES: tuple[tuple[re.Pattern[str], Family], ...] = (
    (re.compile(r"flux"), Family.FLUX),
    (re.compile(r"z[-_]?image"), Family.ZIMAGE),
    (re.compile(r"sd_?xl|xl[_-]?base|(^|[^a-z])xl([^a-z]|$)"), Family.SDXL),
    (re.compile(r"v2[-_.]?[01]|sd_?2[01]?([^0-9]|$)|768-v"), Family.SD2),
    (re.compile(r"v1[-_.]?[45]|sd_?1[-_.]?5|sd15"), Family.SD15),
)


def family_of_base(repo_id: str) -> Family:
    """The family of a base model repo id (case-insensitive); `Family.UNKNOWN` when not in the table."""
    key = repo_id.strip().lower()
    if key in _BY_ID:
        return _BY_ID[key]
    for prefix, family in _SERIES:
        if key.startswith(prefix):
            return family
    return Family.UNKNOWN


def family_from_metadata(metadata: Mapping[str, str]) -> Family | None:
    """The family a safetensors file declares in its kohya/ModelSpec metadata; None when it declares none."""
    architecture = str(metadata.get("modelspec.architecture", "")).strip().lower()
    if architecture:
        for prefix, family in _ARCHITECTURES:
            if architecture.startswith(prefix):
                return family
    version = str(metadata.get("ss_base_model_version", "")).strip().lower()
    if version:
        for prefix, family in _SS_VERSIONS:
            if version.startswith(prefix):
                return family
    if str(metadata.get("ss_v2", "")).strip().lower() == "true":
        return Family.SD2
    model_name = str(metadata.get("ss_sd_model_name", "")).strip().lower()
    if model_name:
        for pattern, family in _MODEL_NAMES:
            if pattern.search(model_name):
                return family
    return None


def family_from_keys(tensor_names: Iterable[str]) -> Family | None:
    """Guess the family from tensor names alone (kohya and diffusers layouts); None when nothing matches.

    The catalogue's label for a local file it lists (families no pool serves included, FLUX among them);
    whether a LoRA fits a served base is judged by the engine's families (`engine.families.origin`), from
    their own signatures. SD 1.x and SD 2.x LoRAs share their tensor names (only shapes differ), so
    both come out as `Family.SD15` here.
    """
    flux = zimage = sdxl = sd1 = False
    for raw in tensor_names:
        name = raw.lower()
        if "double_blocks" in name or "single_blocks" in name or "single_transformer_blocks" in name:
            flux = True
        elif _ZIMAGE_BLOCKS.match(name):
            zimage = True
        elif name.startswith(("lora_te1_", "lora_te2_", "text_encoder_2.", "te2.")):
            sdxl = True
        elif ("transformer_blocks_1_" in name or "transformer_blocks.1." in name) and _is_unet(name):
            # SD 1.x/2.x UNets hold one transformer block per attention; SDXL holds 2 or 10.
            # (SD3 and Flux transformers have numbered transformer_blocks too, but no UNet blocks.)
            sdxl = True
        elif "down_blocks_0_attentions" in name or "down_blocks.0.attentions" in name or "input_blocks_1_1" in name:
            # SDXL's first down block has no attention at all.
            sd1 = True
        elif name.startswith("lora_te_"):
            # kohya names SD 1.x/2.x's single text encoder `lora_te_`, SDXL's two `lora_te1_`/`lora_te2_`.
            sd1 = True
    if flux:
        return Family.FLUX
    if zimage:
        return Family.ZIMAGE
    if sdxl:
        return Family.SDXL
    if sd1:
        return Family.SD15
    return None


def _is_unet(name: str) -> bool:
    return name.startswith(("lora_unet_", "unet.")) or any(block in name for block in _UNET_BLOCKS)
