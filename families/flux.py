"""FLUX.1's identity ([dev], [schnell] and their fine-tunes): BFL's double and single stream blocks name it."""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "KREA_ID", "MODEL_ID", "TINY_ID", "claims", "label_claims"]

MODEL_ID = "black-forest-labs/FLUX.1-dev"
TINY_ID = "tiny-flux"
KREA_ID = "black-forest-labs/FLUX.1-Krea-dev"
DEV = Base(MODEL_ID, "FLUX.1 [dev]")
# FLUX.1 Krea [dev]: FLUX.1 [dev]'s architecture ("fully compatible", Krea's claim), so [dev]'s LoRAs run on it
# with a note. Its card's example runs guidance 4.5 at 1024x1024; its steps are FluxPipeline's 28 ([dev]'s).
KREA = DEV.checkpoint(KREA_ID, "FLUX.1 Krea [dev]", guidance=4.5, names=r"krea")
# Lower-cased names of FLUX LoRAs: BFL's blocks (kohya, ComfyUI, XLabs), diffusers' single blocks and kohya's
# diffusers-named mixture; diffusers' double blocks share `transformer.transformer_blocks.N.attn.` with other DiTs
# (the origin judgement counts claims, so such names alone leave the widths to decide); FLUX.1 has 19 double
# blocks, so it claims only their numbers (Qwen-Image's 60 blocks outnumber it). Later architectures kept some of
# these blocks' names; the layers they added are theirs alone (their rows' `own`).
_CLAIMS = re.compile(
    r"double_blocks|single_blocks|single_transformer_blocks|lora_transformer_"
    r"|^transformer\.transformer_blocks\.(1[0-8]|\d)\.(attn|ff|ff_context|norm1|norm1_context)\."
)
# The names the catalogue labels a file FLUX by: BFL's blocks and diffusers' single blocks (not the diffusers
# double-block names other DiTs share).
_OWN = ("double_blocks", "single_blocks", "single_transformer_blocks")


def claims(name: str) -> bool:
    """A lower-cased tensor name of a FLUX LoRA's transformer part."""
    return bool(_CLAIMS.search(name))


def label_claims(name: str) -> bool:
    """A lower-cased tensor name of FLUX's BFL or single blocks."""
    return any(block in name for block in _OWN)


IDENTITY = FamilyIdentity(
    family=Family.FLUX,
    label="FLUX.1",
    bases=(
        DEV,
        Base("black-forest-labs/FLUX.1-schnell", "FLUX.1 [schnell]"),
        KREA,
    ),
    spellings=Spellings(
        architectures=("flux-1", "flux.1"),
        kohya_versions=("flux",),
        checkpoint_names=r"flux",
    ),
    claims=Claims(names=claims, labels=label_claims),
    released="2024-08",
    civitai=(
        CivitaiLabel("Flux.1 D", MODEL_ID),
        CivitaiLabel("Flux.1 S", "black-forest-labs/FLUX.1-schnell"),
        CivitaiLabel("Flux.1 Krea", KREA_ID),
    ),
    tiny_id=TINY_ID,
    demo=True,
)
