"""FLUX.1 Kontext's identity: BFL's instruction-editing FLUX.1 ([dev]'s architecture, an input image's tokens
beside the output's). Its LoRAs have FLUX.1's tensor names and widths, so they are told apart by what they
declare (a card's `base_model`, metadata naming Kontext, Civitai's "Flux.1 Kontext"), never by their names."""

from __future__ import annotations

from families.identity import Base, CivitaiLabel, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID"]

MODEL_ID = "black-forest-labs/FLUX.1-Kontext-dev"
TINY_ID = "tiny-flux-kontext"


IDENTITY = FamilyIdentity(
    family=Family.FLUX_KONTEXT,
    label="FLUX.1 Kontext",
    bases=(Base(MODEL_ID, "FLUX.1 Kontext [dev]"),),
    # No claims: no tensor name is Kontext's alone, so a LoRA that declares nothing is judged by names alone.
    # Longer than FLUX.1's "flux-1" and "flux": the longest prefix wins (lora_catalog.bases).
    spellings=Spellings(
        architectures=("flux-1-kontext", "flux.1-kontext"),
        kohya_versions=("flux_kontext", "flux-kontext"),
        checkpoint_names=r"kontext",
    ),
    released="2025-06",
    civitai=(CivitaiLabel("Flux.1 Kontext", MODEL_ID),),
    tiny_id=TINY_ID,
)
