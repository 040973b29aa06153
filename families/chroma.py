"""Chroma's identity (Chroma1-HD, Base, Flash and their fine-tunes): FLUX.1 [schnell]'s blocks without their
modulations, and its own small modulation network, `distilled_guidance_layer`, name it."""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["BASE_ID", "FLASH_ID", "IDENTITY", "MODEL_ID", "TINY_ID", "claims", "own_claims"]

MODEL_ID = "lodestones/Chroma1-HD"
TINY_ID = "tiny-chroma"
BASE_ID = "lodestones/Chroma1-Base"
FLASH_ID = "lodestones/Chroma1-Flash"
# Chroma1-HD, the one its makers recommend for inference; its card (and diffusers' Chroma page) runs 40 steps at
# CFG 3.0 with a negative prompt: the family's defaults (engine.families.chroma).
HD = Base(MODEL_ID, "Chroma1-HD", names=r"chroma1?[-_ ]?hd")
# Chroma1-Base: the 512 px pretrained checkpoint HD was fine-tuned from, which trainers (ai-toolkit) train on:
# the same architecture and loader, so LoRAs made on it run on HD and the reverse, with a note.
BASE = HD.checkpoint(BASE_ID, "Chroma1-Base", names=r"chroma1?[-_ ]?base")
# Chroma1-Flash: Base fine-tuned to sample in fewer steps (its makers' research branch). Its card states no
# diffusers call, so it keeps the family's defaults: a request names its own steps and guidance.
FLASH = HD.checkpoint(FLASH_ID, "Chroma1-Flash", names=r"chroma1?[-_ ]?flash")
# Lower-cased names of a Chroma LoRA's transformer part: BFL's blocks (kohya's `lora_unet_`, ComfyUI's
# `diffusion_model.`, the flow trainer's bare names), diffusers' single and double blocks (19, as FLUX.1's), kohya's
# diffusers-named `lora_transformer_` (which FLUX.1 claims too) and its modulation network. XLabs' attention
# processors are FLUX.1's trainer's alone. Chroma pruned FLUX.1's per-block modulations (`img_mod`/`txt_mod`/
# `modulation`, diffusers' `norm1.linear`/`norm.linear`), its final layer's (`adaLN_modulation`, `norm_out.linear`)
# and the embedders feeding them (CLIP's pooled vector, timestep and guidance: `vector_in`, `time_in`,
# `guidance_in`, `time_text_embed`): those names are never Chroma's, so a FLUX.1 LoRA adapting them counts more
# names for FLUX.1 (families.claims).
_BLOCKS = re.compile(
    r"double_blocks|single_blocks|single_transformer_blocks|lora_transformer_"
    r"|^transformer\.transformer_blocks\.(1[0-8]|\d)\.(attn|ff|ff_context)\."
)
_FLUX_ONLY = re.compile(
    r"(img|txt)_mod|modulation|norm1(_context)?[._]linear|norm[._]linear|norm_out[._]linear"
    r"|vector_in|time_in|guidance_in|time_text_embed|processor"
)
# Chroma's own modulation network (about 250 M values where FLUX.1's modulations hold 3.3 B), in every naming.
_OWN = re.compile(r"distilled_guidance_layer")


def claims(name: str) -> bool:
    """A lower-cased tensor name of a Chroma LoRA's transformer part."""
    return bool(_OWN.search(name)) or (bool(_BLOCKS.search(name)) and not _FLUX_ONLY.search(name))


def own_claims(name: str) -> bool:
    """A lower-cased tensor name of Chroma's modulation network, which no other architecture has."""
    return bool(_OWN.search(name))


IDENTITY = FamilyIdentity(
    family=Family.CHROMA,
    label="Chroma",
    bases=(HD, BASE, FLASH),
    # sd-scripts' ModelSpec architecture for Chroma is "chroma" (its library/sai_model_spec.py, ARCH_FLUX_1_CHROMA);
    # checkpoint files are named chroma1-hd, chroma-unlocked-v48 and the like.
    spellings=Spellings(architectures=("chroma",), kohya_versions=("chroma",), checkpoint_names=r"chroma"),
    claims=Claims(names=claims, own=own_claims, labels=own_claims),
    released="2025-08",
    # Civitai's one "Chroma" group holds LoRAs for HD and Base alike: a file's metadata tells which where it names one.
    civitai=(CivitaiLabel("Chroma", MODEL_ID, checkpoints=True),),
    tiny_id=TINY_ID,
)
