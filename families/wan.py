"""Wan's identity (Wan 2.1 text-to-video 1.3B and 14B, Wan 2.2 TI2V-5B: one transformer each): its blocks'
self- and cross-attention and feed-forward at the top of a LoRA's names, in every naming diffusers' Wan loader
reads (diffusers' `transformer.blocks.N.attn1`, ComfyUI/ai-toolkit's `diffusion_model.blocks.N.self_attn`,
kohya/musubi-tuner's `lora_unet_blocks_N_self_attn`). The bases differ in width (1.3B 1536, TI2V-5B 3072, 14B
5120: `engine.families.wan`); an image-to-video LoRA shows the image projections (`k_img`, `v_img`,
`img_emb` / diffusers' `add_k_proj`, `add_v_proj`, `image_embedder`)."""

from __future__ import annotations

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings
from families.wan_names import claims

__all__ = ["IDENTITY", "MODEL_ID", "MODEL_ID_5B", "MODEL_ID_14B", "TINY_ID"]

MODEL_ID = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
MODEL_ID_14B = "Wan-AI/Wan2.1-T2V-14B-Diffusers"
MODEL_ID_5B = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
TINY_ID = "tiny-wan"
IDENTITY = FamilyIdentity(
    family=Family.WAN,
    label="Wan",
    bases=(
        Base(MODEL_ID, "Wan 2.1 T2V 1.3B"),
        Base(MODEL_ID_14B, "Wan 2.1 T2V 14B"),
        Base(MODEL_ID_5B, "Wan 2.2 TI2V 5B"),
    ),
    # musubi-tuner's ModelSpec architectures ("wan2.1-t2v-14b", "wan2.2-ti2v-5b"); others spell it bare.
    spellings=Spellings(
        architectures=("wan2.1", "wan2.2", "wan-2", "wan_2", "wan"),
        kohya_versions=("wan2.1", "wan2.2", "wan"),
        checkpoint_names=r"wan[-_]?2[._]?[12]",
    ),
    claims=Claims(names=claims, labels=claims),
    released="2025-02",
    # Civitai's base labels for the text-to-video bases (image-to-video: `families.wan_i2v`; the 2.2 A14B and 2.5
    # groups are not served yet, docs/internals.md).
    civitai=(
        CivitaiLabel("Wan Video 1.3B t2v", MODEL_ID),
        CivitaiLabel("Wan Video 14B t2v", MODEL_ID_14B),
        CivitaiLabel("Wan Video 2.2 TI2V-5B", MODEL_ID_5B),
    ),
    tiny_id=TINY_ID,
    demo_later="off",
    # lightx2v's speed LoRAs' norm `.diff` and kijai's `.diff_m` (modulation) apply (`engine.families.wan`).
    full_differences=True,
    # Wan 2.2 A14B's transformers are Wan 2.1 14B's blocks, and people run 2.1 LoRAs on them: allowed there with a
    # warning where no Wan 2.1 pool is served, or when a request names the A14B pool (a 1.3B or 5B LoRA's widths
    # fit no layer there and are refused by name).
    falls_back_to=Family.WAN22,
)
