"""Qwen-Image's identity (the 20 B MMDiT and its fine-tunes): its 60 dual-stream blocks' image and text MLPs and
modulations name it, in every naming diffusers' Qwen-Image loader reads."""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "MODEL_ID_2512", "TINY_ID", "claims", "label_claims"]

MODEL_ID = "Qwen/Qwen-Image"
TINY_ID = "tiny-qwen-image"
MODEL_ID_2512 = "Qwen/Qwen-Image-2512"
QWEN_IMAGE = Base(MODEL_ID, "Qwen-Image")
# Qwen-Image-2512: the same 20B architecture and loader, newer weights; Qwen-Image's LoRAs run on it with a note.
# Its card's example runs 50 steps at true CFG 4.0 on Qwen-Image's sizes: the family's own, so no difference.
QWEN_IMAGE_2512 = QWEN_IMAGE.checkpoint(MODEL_ID_2512, "Qwen-Image-2512", names=r"qwen[-_]?image[-_]?2512")
# Lower-cased names of a Qwen-Image LoRA: its blocks' `transformer_blocks.N` in every naming diffusers reads
# (diffusers' `transformer.`, ComfyUI/ai-toolkit's `diffusion_model.`, kohya/musubi's `lora_unet_`, lightx2v's
# bare names). diffusers-named FLUX.1 double blocks share `transformer.transformer_blocks.N.attn.`: there the
# counts tie and the widths decide (FLUX.1 claims only its 19 double blocks' numbers, so a LoRA over Qwen-Image's
# 60 blocks outnumbers it).
_CLAIMS = re.compile(r"^(transformer\.|diffusion_model\.|lora_unet_)?transformer_blocks[._]\d+[._]")
# The names the catalogue labels a file Qwen-Image by: the image and text streams' own MLPs and modulations
# (FLUX.1's BFL names have `img_mlp` too, but under `double_blocks`).
_OWN = re.compile(r"transformer_blocks[._]\d+[._](img|txt)_(mlp|mod)[._]")


def claims(name: str) -> bool:
    """A lower-cased tensor name of a Qwen-Image LoRA."""
    return bool(_CLAIMS.search(name))


def label_claims(name: str) -> bool:
    """A lower-cased tensor name only Qwen-Image LoRAs have."""
    return bool(_OWN.search(name))


IDENTITY = FamilyIdentity(
    family=Family.QWEN_IMAGE,
    label="Qwen-Image",
    bases=(QWEN_IMAGE, QWEN_IMAGE_2512),
    # musubi-tuner writes "Qwen-Image" (its "Qwen-Image-Edit" is the edit family's longer prefix:
    # families/qwen_image_edit.py); others spell it without a separator.
    spellings=Spellings(
        architectures=("qwen-image", "qwen_image", "qwenimage"),
        kohya_versions=("qwen-image", "qwen_image", "qwenimage"),
        checkpoint_names=r"qwen[-_]?image",
    ),
    claims=Claims(names=claims, labels=label_claims),
    released="2025-08",
    # Civitai's one "Qwen" group holds Qwen-Image's and 2512's LoRAs: a file's metadata tells 2512 where it names it
    # (`engine.families.origin`).
    civitai=(CivitaiLabel("Qwen", MODEL_ID, checkpoints=True),),
    tiny_id=TINY_ID,
)
