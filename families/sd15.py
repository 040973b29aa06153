"""SD 1.x's identity (1.4, 1.5 and their fine-tunes). Its LoRAs share every tensor name with SD 2.x's."""

from __future__ import annotations

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings
from families.unet_names import sd_claims

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID"]

MODEL_ID = "stable-diffusion-v1-5/stable-diffusion-v1-5"
TINY_ID = "tiny-sd15"

IDENTITY = FamilyIdentity(
    family=Family.SD15,
    label="SD 1.5",
    bases=(
        Base(MODEL_ID, "Stable Diffusion 1.5"),
        Base("runwayml/stable-diffusion-v1-5", "Stable Diffusion 1.5 (runwayml)"),
        Base("CompVis/stable-diffusion-v1-4", "Stable Diffusion 1.4"),
    ),
    spellings=Spellings(
        architectures=("stable-diffusion-v1",),
        kohya_versions=("sd_v1",),
        checkpoint_names=r"v1[-_.]?[45]|sd_?1[-_.]?5|sd15",
    ),
    claims=Claims(names=sd_claims, labels=sd_claims),
    released="2022-08",
    civitai=(CivitaiLabel("SD 1.5", MODEL_ID),),
    tiny_id=TINY_ID,
    demo=True,
    default_pool=True,
)
