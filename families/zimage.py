"""Z-Image's identity (Turbo, the base checkpoint and their fine-tunes): its transformer's block lists at the top
of a LoRA's names."""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["BASE_ID", "IDENTITY", "MODEL_ID", "TINY_ID", "claims"]

MODEL_ID = "Tongyi-MAI/Z-Image-Turbo"
TINY_ID = "tiny-zimage"
BASE_ID = "Tongyi-MAI/Z-Image"
TURBO = Base(MODEL_ID, "Z-Image Turbo", names=r"z[-_]?image[-_]?turbo")
# Z-Image (base): Turbo's architecture and loader, undistilled. Its card (Tongyi-MAI/Z-Image; the same text in the
# Z-Image repository's README) recommends 28-50 steps at guidance 3.0-5.0 with a negative prompt, any aspect ratio
# from 512x512 to 2048x2048 in area, and runs its example at 50 steps, guidance 4 (the defaults here; the family's
# 1024 side lies in that range). Turbo's card's are 8-9 steps without CFG (the family's). Base-trained LoRAs run on
# Turbo and Turbo's on it, with a note (its discussion #18 asks this).
BASE = TURBO.checkpoint(BASE_ID, "Z-Image", steps=50, guidance=4.0, names=r"z[-_]?image[-_]?base")
# Lower-cased names only Z-Image LoRAs have: its blocks' lists at the top of the transformer, in every naming
# (diffusers', ComfyUI's `diffusion_model.`, kohya's `lora_unet_`). No UNet, FLUX or CLIP name starts so
# (CLIP's `encoder.layers.N` never starts a name).
_CLAIMS = re.compile(r"^(transformer\.|diffusion_model\.|lora_unet_)?(layers|noise_refiner|context_refiner)[._]\d+[._]")


def claims(name: str) -> bool:
    """A lower-cased tensor name of a Z-Image LoRA."""
    return bool(_CLAIMS.search(name))


IDENTITY = FamilyIdentity(
    family=Family.ZIMAGE,
    label="Z-Image",
    bases=(TURBO, BASE),
    # Z-Image trainers (musubi-tuner, ai-toolkit) spell the architecture with or without a separator.
    spellings=Spellings(
        architectures=("z-image", "z_image", "zimage"),
        kohya_versions=("z-image", "z_image", "zimage"),
        checkpoint_names=r"z[-_]?image",
    ),
    claims=Claims(names=claims, labels=claims),
    released="2025-11",
    civitai=(CivitaiLabel("ZImageTurbo", MODEL_ID), CivitaiLabel("ZImageBase", BASE_ID)),
    tiny_id=TINY_ID,
    demo_later="fp8",
)
