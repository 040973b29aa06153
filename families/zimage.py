"""Z-Image's identity (Turbo and its fine-tunes): its transformer's block lists at the top of a LoRA's names."""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID", "claims"]

MODEL_ID = "Tongyi-MAI/Z-Image-Turbo"
TINY_ID = "tiny-zimage"
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
    bases=(Base(MODEL_ID, "Z-Image Turbo"),),
    # Z-Image trainers (musubi-tuner, ai-toolkit) spell the architecture with or without a separator.
    spellings=Spellings(
        architectures=("z-image", "z_image", "zimage"),
        kohya_versions=("z-image", "z_image", "zimage"),
        checkpoint_names=r"z[-_]?image",
    ),
    claims=Claims(names=claims, labels=claims),
    released="2025-11",
    civitai=(CivitaiLabel("ZImageTurbo", MODEL_ID),),
    tiny_id=TINY_ID,
)
