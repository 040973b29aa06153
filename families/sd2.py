"""SD 2.x's identity (2.0, 2.1 and their 512 px bases). Its LoRAs share every tensor name with SD 1.x's, so the
catalogue labels them by metadata only; the engine tells them apart by widths. Civitai files no label here."""

from __future__ import annotations

from families.identity import Base, Claims, Family, FamilyIdentity, Spellings
from families.unet_names import sd_claims

__all__ = ["IDENTITY"]

IDENTITY = FamilyIdentity(
    family=Family.SD2,
    label="SD 2.x",
    bases=(
        Base("stabilityai/stable-diffusion-2-1", "Stable Diffusion 2.1"),
        Base("stabilityai/stable-diffusion-2-1-base", "Stable Diffusion 2.1 base"),
    ),
    spellings=Spellings(
        architectures=("stable-diffusion-v2",),
        kohya_versions=("sd_v2",),
        kohya_v2=True,
        checkpoint_names=r"v2[-_.]?[01]|sd_?2[01]?([^0-9]|$)|768-v",
    ),
    # SD 1.x's names: the catalogue labels none SD 2.x's (the engine's widths tell them apart).
    claims=Claims(names=sd_claims),
    released="2022-11",
)
