"""SDXL's identity: SDXL 1.0, its well-known fine-tunes and the ecosystems Civitai files apart (Pony, Illustrious,
NoobAI). Its LoRAs show two text encoders or UNet attentions holding more than one transformer block. The SDXL
refiner and Playground v2.5 look alike but take no SDXL LoRA, so they are left out on purpose."""

from __future__ import annotations

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings
from families.unet_names import is_unet_name

__all__ = ["IDENTITY", "ILLUSTRIOUS_BASE", "MODEL_ID", "NOOBAI_BASE", "PONY_BASE", "TINY_ID", "claims"]

MODEL_ID = "stabilityai/stable-diffusion-xl-base-1.0"
TINY_ID = "tiny"
# SDXL fine-tunes that are ecosystems of their own (Civitai files LoRAs under "Pony", "Illustrious" and "NoobAI"
# as base models, most of its SDXL-shaped ones): the repo id standing for each (its authors' own), SDXL-shaped.
# `MODELS` may name one as the BASE of a pool serving that fine-tune; else their LoRAs run on the SDXL pool.
PONY_BASE = "AstraliteHeart/pony-diffusion-v6"
ILLUSTRIOUS_BASE = "OnomaAIResearch/Illustrious-xl-early-release-v0"
NOOBAI_BASE = "Laxhar/noobai-XL-1.1"


def claims(name: str) -> bool:
    """A lower-cased tensor name only an SDXL LoRA has."""
    if name.startswith(("lora_te1_", "lora_te2_", "text_encoder_2.", "te2.")):
        return True
    # SD 1.x/2.x UNets hold one transformer block per attention; SDXL holds 2 or 10. (SD3 and Flux transformers
    # have numbered transformer_blocks too, but no UNet blocks.)
    return ("transformer_blocks_1_" in name or "transformer_blocks.1." in name) and is_unet_name(name)


IDENTITY = FamilyIdentity(
    family=Family.SDXL,
    label="SDXL",
    bases=(
        Base(MODEL_ID, "SDXL 1.0"),
        Base("stabilityai/sdxl-turbo", "SDXL Turbo"),
        Base("RunDiffusion/Juggernaut-XL-v9", "Juggernaut XL v9"),
        Base("SG161222/RealVisXL_V4.0", "RealVisXL V4.0"),
        Base("Lykon/dreamshaper-xl-1-0", "DreamShaper XL 1.0"),
        Base("cagliostrolab/animagine-xl-3.1", "Animagine XL 3.1"),
        Base(PONY_BASE, "Pony Diffusion V6 XL"),
        Base(ILLUSTRIOUS_BASE, "Illustrious XL"),
        Base(NOOBAI_BASE, "NoobAI XL"),
    ),
    # Fine-tune series publish one repo per version; every version keeps the SDXL architecture.
    series=("rundiffusion/juggernaut-xl-", "sg161222/realvisxl_", "cagliostrolab/animagine-xl-"),
    spellings=Spellings(
        architectures=("stable-diffusion-xl",),
        kohya_versions=("sdxl",),
        checkpoint_names=r"sd_?xl|xl[_-]?base|(^|[^a-z])xl([^a-z]|$)",
    ),
    claims=Claims(names=claims, labels=claims),
    released="2023-07",
    civitai=(
        CivitaiLabel("SDXL 1.0", MODEL_ID),
        CivitaiLabel("Pony", PONY_BASE, finetune=True),
        CivitaiLabel("Illustrious", ILLUSTRIOUS_BASE, finetune=True),
        CivitaiLabel("NoobAI", NOOBAI_BASE, finetune=True),
    ),
    tiny_id=TINY_ID,
    demo=True,
    default_pool=True,
)
