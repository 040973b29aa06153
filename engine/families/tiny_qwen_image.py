"""A tiny Qwen-Image, built locally from nothing downloaded: its transformer, its Wan-style VAE
(`AutoencoderKLQwenImage`), a Qwen2.5-VL text encoder and a byte-level BPE tokenizer in Qwen's layout.

Kept apart from `engine.families.qwen_image` (the family's declaration) so that each stays small; the structure
is Qwen-Image's (dual-stream blocks with image and text MLPs and modulations, 16 latent channels normalised by
the VAE's per-channel mean and std), the sizes a CPU's.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from engine.families.tiny import TINY_SIDE, byte_level_tokenizer

__all__ = ["SCHEDULER", "TINY_WIDTH", "build_tiny_pipeline", "tiny_qwen2_5_vl_tokenizer", "tiny_qwen_transformer"]

# The tiny transformer's hidden width: 2 heads of 28, a width no other tiny pipeline has, so widths tell the tiny
# ones apart as they tell the real ones (3072) from FLUX.1's (also 3072: there the names decide).
TINY_WIDTH = 72
# Qwen/Qwen-Image's scheduler/scheduler_config.json (the shift grows with the image's tokens, exponentially).
SCHEDULER: dict[str, Any] = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}
# Qwen2.5-VL's special tokens the prompt template and (for the edit pipelines) an image's place use.
_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


# The words of QwenImagePipeline's prompt template as whole tokens, as in Qwen's vocabulary (added tokens, the
# leading space included: merges made for them would compete with the shared vocabulary's): the template's system
# turn then comes to the 34 tokens the pipeline drops (`prompt_template_encode_start_idx`), as with Qwen's own
# tokenizer, and only the user's prompt conditions the image.
_TEMPLATE_WORDS = (
    "system",
    "user",
    "assistant",
    "Describe",
    " image",
    " detailing",
    " color",
    " shape",
    " size",
    " texture",
    " text",
    " quantity",
    " spatial",
    " relationships",
    " objects",
    " background",
)


def tiny_qwen2_5_vl_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer in Qwen2.5-VL's layout, built with `tokenizers` from the tiny pipelines'
    vocabulary (a whole-word token per demo word and prompt template word, bytes for the rest), with its special
    tokens."""
    tokenizer = byte_level_tokenizer(_SPECIAL)
    tokenizer.add_tokens([AddedToken(word, normalized=False) for word in _TEMPLATE_WORDS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=2048
    )


def _text_encoder(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2_5_VLForConditionalGeneration:
    """Qwen2.5-VL 32 wide (4 heads of 8, its multimodal rotary sections halved down), a one-block vision tower."""
    ids: dict[str, Any] = {name: tokenizer.convert_tokens_to_ids(token) for name, token in _VISION_TOKENS.items()}
    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "rope_theta": 1_000_000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tokenizer.eos_token_id,
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 32},
        **ids,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


_VISION_TOKENS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


def tiny_qwen_transformer(width: int, axes_dims_rope: tuple[int, int, int]) -> QwenImageTransformer2DModel:
    """Qwen-Image's transformer structure `width` wide (2 heads, their RoPE axes summing to the head's width), 2
    blocks over the tiny encoder's 32-wide text: the tiny Qwen-Image's and the tiny Qwen-Image-Edit's, each at a
    width of its own. Seeded by the caller."""
    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16 * 4,
        out_channels=16,
        num_layers=2,
        attention_head_dim=width // 2,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=axes_dims_rope,
    )


def build_tiny_pipeline(seed: int = 0) -> QwenImagePipeline:
    """A tiny Qwen-Image: 2 dual-stream blocks 72 wide (2 heads of 36: each tiny pipeline has a width of its own),
    a Qwen2.5-VL encoder 32 wide with its tokenizer, a 16-channel Wan-style VAE downsampling 4x with Qwen-Image's
    latent mean and std, and its scheduler. About 0.3 M transformer parameters; the same seed gives the same
    weights. The VAE's config states the tiny default side (64), as a tiny AutoencoderKL's `sample_size` does for
    the other families."""
    tokenizer = tiny_qwen2_5_vl_tokenizer()
    torch.manual_seed(seed)
    transformer = tiny_qwen_transformer(TINY_WIDTH, axes_dims_rope=(8, 14, 14))
    torch.manual_seed(seed + 1)
    # diffusers' defaults are Qwen-Image's latent mean and std (its VAE's encoder is Wan 2.1's).
    vae: Any = AutoencoderKLQwenImage(
        base_dim=8, z_dim=16, dim_mult=[1, 2, 4], num_res_blocks=1, temperal_downsample=[False, True]
    )
    vae.register_to_config(sample_size=TINY_SIDE)
    text_encoder = _text_encoder(tokenizer, seed + 2)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    pipe = QwenImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe
