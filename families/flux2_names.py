"""Tensor names of FLUX.2's transformer (diffusers' `Flux2Transformer2DModel`, BFL's FLUX.2 blocks), compared
lower-cased: FLUX.2 [klein] and [dev] are both that transformer, so both families' rows read these.

FLUX.2 keeps FLUX.1's block names (BFL's `double_blocks`/`single_blocks`, diffusers' `transformer_blocks`/
`single_transformer_blocks`); its own layers are the fused single-block projection (`to_qkv_mlp_proj`), the
single blocks' `to_out`, the SwiGLU feed-forward (`linear_in`/`linear_out`) and the shared modulations. Where a file
holds only the shared names, its factors' shapes tell the architectures apart (`engine.families.bfl_blocks`).
"""

from __future__ import annotations

import re

__all__ = ["own_name", "shared_name"]

# Names only FLUX.2 LoRAs have, in diffusers', BFL's (ai-toolkit, ComfyUI) and kohya's namings.
_OWN = re.compile(
    r"to_qkv_mlp_proj|single_transformer_blocks\.\d+\.attn\.to_out\.|\.ff(_context)?\.linear_(in|out)\."
    r"|(single|double)_stream_modulation"
)
# The names FLUX.2 shares with FLUX.1: BFL's double-block attention and MLP and single-block linear1/linear2 (any
# prefix: ComfyUI's `diffusion_model.`, kohya's `lora_unet_`), diffusers' double-block attention. FLUX.2 has at
# most 8 double blocks (klein 9B and [dev]; klein 4B has 5), so only their numbers in diffusers' naming.
_SHARED = re.compile(
    r"double_blocks[._]\d+[._](img|txt)_(attn|mlp)[._]|single_blocks[._]\d+[._]linear[12][._]"
    r"|(^|\.)transformer_blocks\.[0-7]\.attn\."
)


def own_name(name: str) -> bool:
    """A lower-cased tensor name of a layer only FLUX.2's transformer has."""
    return bool(_OWN.search(name))


def shared_name(name: str) -> bool:
    """A lower-cased tensor name of a block FLUX.2's transformer shares with FLUX.1's."""
    return bool(_SHARED.search(name))
