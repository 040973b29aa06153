"""Krea 2's identity (Turbo, Raw and their fine-tunes): its single-stream blocks' gated attention and SwiGLU MLP, and
its text-fusion stage, in every naming diffusers' Krea 2 loader reads (and kohya's)."""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = [
    "IDENTITY",
    "MODEL_ID",
    "RAW_GUIDANCE",
    "RAW_ID",
    "RAW_STEPS",
    "TINY_ID",
    "TURBO_GUIDANCE",
    "TURBO_STEPS",
    "claims",
    "own_name",
]

MODEL_ID = "krea/Krea-2-Turbo"
RAW_ID = "krea/Krea-2-Raw"
TINY_ID = "tiny-krea2"
# Turbo: the few-step distilled model the LoRAs usually run on (krea-ai/krea-2's README: 8 steps without CFG; its
# `model_index.json` sets `is_distilled`, which fixes the shift). Its settings are read by the family's defaults
# (`engine.families.krea2`); the "Krea 2 Turbo" speed LoRA's preset (`lora_catalog.hints`) states the same.
TURBO_STEPS, TURBO_GUIDANCE = 8, 0.0
TURBO = Base(MODEL_ID, "Krea 2 Turbo", names=r"krea[-_ ]?2[-_ ]?turbo")
# Raw: the undistilled model LoRAs are trained on, Turbo's architecture and loader. Its defaults are
# Krea2Pipeline's own (diffusers 0.42.1: 28 steps at CFG 4.5). Raw-trained LoRAs run on Turbo (the README's
# "train on Raw, generate with Turbo") and Turbo's on Raw, with a note.
RAW_STEPS, RAW_GUIDANCE = 28, 4.5
RAW = TURBO.checkpoint(
    RAW_ID, "Krea 2 Raw", steps=RAW_STEPS, guidance=RAW_GUIDANCE, names=r"krea[-_ ]?2[-_ ]?(raw|base)"
)
# Lower-cased names only Krea 2 LoRAs have, in each naming: the attention's output gate, the SwiGLU MLP's
# gate/up/down and the text-fusion stage in diffusers' names (`transformer_blocks.N.attn.to_gate`, `.ff.gate`,
# `text_fusion.`); the original model's (ComfyUI's `diffusion_model.`, ai-toolkit's `base_model.model.`, kohya's
# `lora_unet_`): `blocks.N.attn.wq/wk/wv/wo/gate`, `blocks.N.mlp.gate/up/down`, `txtfusion.`, and its standalone
# modules (`tmlp`, `tproj`, `txtmlp`). No other architecture names a layer so (Wan's blocks are
# `blocks.N.self_attn`/`ffn`, FLUX's and Qwen-Image's MLPs `ff.net`/`img_mlp`).
_OWN = re.compile(
    r"transformer_blocks[._]\d+[._](attn[._]to_gate|ff[._](gate|up|down))[._]|text_fusion[._]|txtfusion[._]"
    r"|(^|\.|^lora_unet_)blocks[._]\d+[._](attn[._](w[qkvo]|gate|qkv)|mlp[._](gate|up|down))[._]"
    r"|^(diffusion_model\.|base_model\.model\.|lora_unet_)(tmlp|tproj|txtmlp)[._]"
)
# Its diffusers-named attention projections, which FLUX's and Qwen-Image's diffusers names share: the counts and
# the widths (6144: the engine's row) decide there. Krea 2 has 28 blocks.
_SHARED = re.compile(r"^(transformer\.)?transformer_blocks\.([01]?\d|2[0-7])\.attn\.(to_[qkv]|to_out\.0)\.")


def own_name(name: str) -> bool:
    """A lower-cased tensor name of a layer only Krea 2 has."""
    return bool(_OWN.search(name))


def claims(name: str) -> bool:
    """A lower-cased tensor name of a Krea 2 LoRA."""
    return own_name(name) or bool(_SHARED.search(name))


IDENTITY = FamilyIdentity(
    family=Family.KREA2,
    label="Krea 2",
    bases=(TURBO, RAW),
    # Trainers spell the architecture with or without a separator (ai-toolkit's `krea2`).
    spellings=Spellings(
        architectures=("krea-2", "krea_2", "krea2"),
        kohya_versions=("krea-2", "krea_2", "krea2"),
        checkpoint_names=r"krea[-_ ]?2",
    ),
    claims=Claims(names=claims, own=own_name, labels=own_name),
    released="2026-06",
    # Civitai's group for Krea 2's LoRAs (trained on Raw, run on either): its `baseModel` string is "Krea 2"
    # (civitai/civitai, src/utils/training.ts's krea2 entry `baseModel: 'Krea 2'`; its ecosystem key is `Krea2`).
    civitai=(CivitaiLabel("Krea 2", RAW_ID),),
    tiny_id=TINY_ID,
)
