"""Tensor names the UNet families' identities share (SDXL, SD 1.x, SD 2.x), compared lower-cased."""

from __future__ import annotations

__all__ = ["is_unet_name", "sd_claims"]

_UNET_BLOCKS = ("down_blocks", "up_blocks", "mid_block", "input_blocks", "output_blocks", "middle_block")


def is_unet_name(name: str) -> bool:
    """A lower-cased tensor name of a UNet module, in kohya, PEFT/diffusers or original (LDM) naming."""
    return name.startswith(("lora_unet_", "unet.")) or any(block in name for block in _UNET_BLOCKS)


def sd_claims(name: str) -> bool:
    """A lower-cased tensor name only an SD 1.x or SD 2.x LoRA has (both: they share every name)."""
    # SDXL's first down block has no attention at all (`input_blocks_1_1` is the same block in LDM naming).
    first_attention = "down_blocks_0_attentions" in name or "down_blocks.0.attentions" in name
    # kohya names SD 1.x/2.x's single text encoder `lora_te_`, SDXL's two `lora_te1_`/`lora_te2_`.
    return first_attention or "input_blocks_1_1" in name or name.startswith("lora_te_")
