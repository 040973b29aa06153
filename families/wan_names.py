"""The tensor names of Wan LoRAs, shared by the Wan families' rows of the claims table (`families.wan`,
`families.wan_i2v`): a block's attention or feed-forward in every naming diffusers' Wan loader reads, and the
image-to-video models' own image layers."""

from __future__ import annotations

import re

__all__ = ["claims", "image_to_video_name"]

# Lower-cased names of a Wan LoRA: a block's attention or feed-forward directly under the transformer (FLUX's
# and Qwen-Image's blocks are `transformer_blocks`, a UNet's `down_blocks`: none starts so).
_CLAIMS = re.compile(
    r"^(transformer\.|diffusion_model\.|lora_unet_)?blocks[._]\d+[._](self_attn|cross_attn|attn1|attn2|ffn)[._]"
)
# The image-to-video models' own layers: the cross-attention's image keys and values and the image embedder.
_IMAGE_TO_VIDEO = re.compile(r"(k_img|v_img|add_k_proj|add_v_proj|img_emb|image_embedder)[._]")


def claims(name: str) -> bool:
    """A lower-cased tensor name of a Wan LoRA."""
    return bool(_CLAIMS.search(name))


def image_to_video_name(name: str) -> bool:
    """A lower-cased tensor name only an image-to-video Wan LoRA has."""
    return bool(_IMAGE_TO_VIDEO.search(name))
