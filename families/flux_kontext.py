"""FLUX.1 Kontext's identity: BFL's instruction-editing FLUX.1 ([dev]'s architecture, an input image's tokens
beside the output's). Its LoRAs have FLUX.1's tensor names and widths, so they are told apart by what they
declare (a card's `base_model`, metadata naming Kontext, Civitai's "Flux.1 Kontext"), never by their names."""

from __future__ import annotations

from families.identity import Base, CivitaiLabel, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID"]

MODEL_ID = "black-forest-labs/FLUX.1-Kontext-dev"
TINY_ID = "tiny-flux-kontext"


def claims(name: str) -> bool:
    """No tensor name is Kontext's alone: a LoRA that declares nothing is judged a FLUX.1 one."""
    return False


IDENTITY = FamilyIdentity(
    family=Family.FLUX_KONTEXT,
    label="FLUX.1 Kontext",
    bases=(Base(MODEL_ID, "FLUX.1 Kontext [dev]"),),
    claims=claims,
    # Longer than FLUX.1's "flux-1" and "flux": the longest prefix wins (lora_catalog.bases).
    spellings=Spellings(
        architectures=("flux-1-kontext", "flux.1-kontext"),
        kohya_versions=("flux_kontext", "flux-kontext"),
        checkpoint_names=r"kontext",
    ),
    # Before FLUX.1 where a checkpoint name shows both ("flux1-kontext-dev").
    precedence=-1,
    released="2025-06",
    civitai=(CivitaiLabel("Flux.1 Kontext", MODEL_ID),),
    tiny_id=TINY_ID,
)
