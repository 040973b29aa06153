"""A tiny Krea 2 Turbo built locally from nothing downloaded: its real structure (single-stream blocks with gated
GQA attention and a SwiGLU MLP, the text-fusion stage over several of Qwen3-VL's layers, shared modulation and
per-block tables), Qwen-Image's Wan-style VAE, a Qwen3-VL encoder and a byte-level tokenizer in Qwen's layout.

At a width no other tiny pipeline has (104: 4 query heads of 26 over 2 key/value heads), so LoRA shapes tell it
apart as the real one's 6144 does; its k and v are 52 wide, as the real model's are a quarter of its q's.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, Krea2Pipeline, Krea2Transformer2DModel
from transformers import PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLModel

from engine.families.tiny import TINY_SIDE
from engine.families.tiny_qwen_image import tiny_qwen2_5_vl_tokenizer

__all__ = ["SCHEDULER", "TINY_TRANSFORMER", "TINY_WIDTH", "build_tiny_pipeline"]

# The tiny transformer's hidden width (heads x head width).
TINY_WIDTH = 104
# The tiny encoder's layers the pipeline stacks: its embeddings' output and both decoder layers' (the real one taps
# 12 of Qwen3-VL-4B's 36).
_TEXT_LAYERS = (0, 1, 2)
TINY_TRANSFORMER: dict[str, Any] = {
    # The VAE's 16 channels in 2x2 patches.
    "in_channels": 64,
    "num_layers": 2,
    "attention_head_dim": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 160,
    "timestep_embed_dim": 32,
    "text_hidden_dim": 32,
    "num_text_layers": len(_TEXT_LAYERS),
    "text_num_attention_heads": 2,
    "text_num_key_value_heads": 1,
    "text_intermediate_size": 48,
    "num_layerwise_text_blocks": 1,
    "num_refiner_text_blocks": 1,
    "axes_dims_rope": (6, 10, 10),
}
# Krea 2's resolution-aware exponential shift, as Krea2Pipeline's docstring asks of its scheduler (a distilled
# pipeline passes its fixed mu, 1.15).
SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 6400,
}


# Qwen's vision tokens, by the names Qwen3-VL's config gives their ids.
_VISION = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


def _text_encoder(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen3VLModel:
    """Qwen3-VL 32 wide (4 heads of 8, its multimodal rotary sections scaled down), 2 layers, a 1-block vision
    tower."""
    ids: dict[str, Any] = {name: tokenizer.convert_tokens_to_ids(token) for name, token in _VISION.items()}
    torch.manual_seed(seed)
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 2048,
            "rope_scaling": {"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True},
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 32},
        **ids,
    )
    return Qwen3VLModel(config).eval()


def build_tiny_pipeline(seed: int = 0) -> Krea2Pipeline:
    """A tiny distilled Krea 2 (Turbo's `is_distilled`): the transformer above, a Qwen3-VL encoder 32 wide read at
    its 3 hidden states, Qwen's tokenizer layout with the prompt template's words whole (the pipeline drops the
    template's 34 system tokens, as with Qwen's own), Qwen-Image's 16-channel VAE downsampling 4x, and Krea 2's
    scheduler. About 0.4 M transformer parameters; the same seed gives the same weights. The VAE's config states
    the tiny default side (64), as the other tiny VAEs' `sample_size` does."""
    tokenizer = tiny_qwen2_5_vl_tokenizer()
    torch.manual_seed(seed)
    transformer = Krea2Transformer2DModel(**TINY_TRANSFORMER)
    torch.manual_seed(seed + 1)
    vae: Any = AutoencoderKLQwenImage(
        base_dim=8, z_dim=16, dim_mult=[1, 2, 4], num_res_blocks=1, temperal_downsample=[False, True]
    )
    vae.register_to_config(sample_size=TINY_SIDE)
    pipe = Krea2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae,
        text_encoder=_text_encoder(tokenizer, seed + 2),
        tokenizer=tokenizer,
        transformer=transformer,
        text_encoder_select_layers=_TEXT_LAYERS,
        is_distilled=True,
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe
