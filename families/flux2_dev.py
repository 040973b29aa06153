"""FLUX.2 [dev]'s identity: BFL's 32 B FLUX.2 (`Flux2Pipeline`, a Mistral Small 3.1 text encoder). Its LoRAs have
klein's tensor names (the same `Flux2Transformer2DModel` blocks, the same `Flux2LoraLoaderMixin` namings), so
it claims that transformer's names (`families.flux2_names`); the hidden width tells them apart (6144 where
klein's are 3072 and 4096: `engine.families.flux2_dev.WIDTHS`), else what a LoRA declares (its card, metadata
naming [dev], Civitai's "Flux.2 D").
"""

from __future__ import annotations

from families.flux2_names import own_name, shared_name
from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID"]

MODEL_ID = "black-forest-labs/FLUX.2-dev"
TINY_ID = "tiny-flux2-dev"

IDENTITY = FamilyIdentity(
    family=Family.FLUX2_DEV,
    label="FLUX.2 [dev]",
    bases=(Base(MODEL_ID, "FLUX.2 [dev]"),),
    # Longer than klein's `flux-2`/`flux2` prefixes: the longest prefix wins (lora_catalog.bases); a file saying
    # only `flux2` stays klein's (Civitai's default FLUX.2 model).
    spellings=Spellings(
        architectures=("flux-2-dev", "flux.2-dev", "flux_2_dev", "flux2-dev", "flux2_dev"),
        kohya_versions=("flux-2-dev", "flux.2-dev", "flux_2_dev", "flux2-dev", "flux2_dev"),
        checkpoint_names=r"flux[-_.]?2[-_.]?dev",
    ),
    # No labels: the catalogue labels a file showing FLUX.2's own names klein's (Civitai's default FLUX.2 model).
    claims=Claims(names=shared_name, own=own_name),
    released="2025-11",
    civitai=(CivitaiLabel("Flux.2 D", MODEL_ID),),
    tiny_id=TINY_ID,
)
