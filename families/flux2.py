"""FLUX.2 [klein]'s identity (4B and 9B, distilled and base): FLUX.2's own layers name it, where FLUX.1's do not.

FLUX.2 keeps FLUX.1's block names (BFL's `double_blocks`/`single_blocks`, diffusers' `transformer_blocks`/
`single_transformer_blocks`), so many of its LoRA names are FLUX.1's too; its own are the fused single-block
projection (`to_qkv_mlp_proj`), the SwiGLU feed-forward (`linear_in`/`linear_out`) and the shared modulations.
Where a file holds only the shared names, its factors' shapes tell the two apart (`engine.families.flux2`).
"""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Family, FamilyIdentity, Spellings

__all__ = ["BASE_4B", "BASE_9B", "IDENTITY", "MODEL_ID", "MODEL_ID_9B", "TINY_ID", "claims", "own_name"]

# The distilled models (4 steps, no guidance) and their undistilled bases, as BFL and diffusers name them.
MODEL_ID = "black-forest-labs/FLUX.2-klein-4B"
MODEL_ID_9B = "black-forest-labs/FLUX.2-klein-9B"
BASE_4B = "black-forest-labs/FLUX.2-klein-base-4B"
BASE_9B = "black-forest-labs/FLUX.2-klein-base-9B"
TINY_ID = "tiny-flux2"
# Lower-cased names only FLUX.2 LoRAs have, in diffusers', BFL's (ai-toolkit, ComfyUI) and kohya's namings.
_OWN = re.compile(
    r"to_qkv_mlp_proj|single_transformer_blocks\.\d+\.attn\.to_out\.|\.ff(_context)?\.linear_(in|out)\."
    r"|(single|double)_stream_modulation"
)
# The names FLUX.2 shares with FLUX.1 (which FLUX.1's identity claims too): BFL's double-block attention and MLP
# and single-block linear1/linear2 (any prefix: ComfyUI's `diffusion_model.`, kohya's `lora_unet_`), diffusers'
# double-block attention. A tie its shapes break (engine.families.bfl_blocks). klein has at most 8 double blocks
# (9B; 4B has 5), so it claims only their numbers in diffusers' naming (Qwen-Image's 60 blocks outnumber it).
_SHARED = re.compile(
    r"double_blocks[._]\d+[._](img|txt)_(attn|mlp)[._]|single_blocks[._]\d+[._]linear[12][._]"
    r"|(^|\.)transformer_blocks\.[0-7]\.attn\."
)


def own_name(name: str) -> bool:
    """A lower-cased tensor name of a layer only FLUX.2 has (FLUX.1's identity leaves these to FLUX.2)."""
    return bool(_OWN.search(name))


def claims(name: str) -> bool:
    """A lower-cased tensor name of a FLUX.2 LoRA's transformer part: its own layers' or the blocks it shares
    with FLUX.1 (those leave the shapes to decide)."""
    return own_name(name) or bool(_SHARED.search(name))


IDENTITY = FamilyIdentity(
    family=Family.FLUX2,
    label="FLUX.2 [klein]",
    bases=(
        Base(MODEL_ID, "FLUX.2 [klein] 4B"),
        Base(MODEL_ID_9B, "FLUX.2 [klein] 9B"),
        Base(BASE_4B, "FLUX.2 [klein] base 4B"),
        Base(BASE_9B, "FLUX.2 [klein] base 9B"),
    ),
    claims=claims,
    # Trainers spell FLUX.2 with or without a separator (musubi-tuner's `flux_2`, ai-toolkit's `flux2`); the
    # longest prefix wins over FLUX.1's `flux`.
    spellings=Spellings(
        architectures=("flux-2", "flux.2", "flux_2", "flux2"),
        kohya_versions=("flux-2", "flux.2", "flux_2", "flux2"),
        checkpoint_names=r"flux[-_.]?2|klein",
    ),
    label_claims=own_name,
    # Before FLUX.1: a checkpoint named `flux-2-klein` matches FLUX.1's `flux` too.
    precedence=-1,
    released="2026-01",
    # Civitai's labels for klein (its default FLUX.2 model); "Flux.2 D" is FLUX.2 [dev]'s (families/flux2_dev.py).
    civitai=(
        CivitaiLabel("Flux.2 Klein 4B", MODEL_ID),
        CivitaiLabel("Flux.2 Klein 9B", MODEL_ID_9B),
        CivitaiLabel("Flux.2 Klein 4B-base", BASE_4B),
        CivitaiLabel("Flux.2 Klein 9B-base", BASE_9B),
    ),
    tiny_id=TINY_ID,
)
