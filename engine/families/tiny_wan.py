"""A tiny Wan (2.1 text-to-video), built locally from nothing downloaded: its transformer, its video VAE
(`AutoencoderKLWan`), a UMT5 text encoder with a T5-layout tokenizer, and Wan 2.1's scheduler.

Kept apart from `engine.families.wan` (the family's declaration) so that each stays small; the structure is
Wan's (blocks of self-attention, text cross-attention and a feed-forward, 3D RoPE over frames and the 2x2
patches, a causal video VAE packing 4 frames in a latent frame after the first), the sizes a CPU's: 5 frames at
64 px are 2 latent frames of 8 x 8.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLWan,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    CLIPVisionModelWithProjection,
    UMT5Config,
    UMT5EncoderModel,
)

from engine.families.tiny import TINY_SIDE, tiny_t5_tokenizer

__all__ = [
    "SCHEDULER",
    "TINY_FRAMES",
    "TINY_I2V_WIDTH",
    "TINY_WIDTH",
    "build_tiny_a14b_pipeline",
    "build_tiny_i2v_pipeline",
    "build_tiny_pipeline",
    "build_tiny_ti2v_pipeline",
    "tiny_wan_transformer",
]

# The tiny transformer's hidden width: 2 heads of 22 (Wan's RoPE splits a head 10 / 6 / 6 over frames, height and
# width), a width no other tiny pipeline has, so widths tell the tiny ones apart as they tell the real ones.
TINY_WIDTH = 44
# The tiny two-stage model's transformers': 2 heads of 18 (RoPE 6 / 6 / 6 per head).
TINY_A14B_WIDTH = 36
# Wan 2.2 T2V-A14B's boundary: the high-noise transformer runs while the timestep is at least 875 of 1000.
A14B_BOUNDARY = 0.875
# The tiny two-stage image-to-video model's transformers': 2 heads of 30 (RoPE 10 / 10 / 10 per head).
TINY_A14B_I2V_WIDTH = 60
# Wan 2.2 I2V-A14B's boundary (Wan's configs/wan_i2v_A14B.py `boundary = 0.900`; its Diffusers repo's model_index).
A14B_I2V_BOUNDARY = 0.9
# The tiny TI2V-5B-shaped transformer's: 2 heads of 28 (RoPE 12 / 8 / 8 per head), over Wan 2.2's 48 channels.
TINY_TI2V_WIDTH = 56
# The tiny image-to-video transformer's: 2 heads of 26 (RoPE 14 / 6 / 6 per head).
TINY_I2V_WIDTH = 52
# The tiny pool's default frames (4k+1: 2 latent frames).
TINY_FRAMES = 5
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers' scheduler/scheduler_config.json (UniPC over flow sigmas, shift 3 at 480P).
SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
}
_TEXT_WIDTH = 32


def tiny_wan_transformer(width: int = TINY_WIDTH, **extra: Any) -> WanTransformer3DModel:
    """Wan's transformer `width` wide (2 heads), 2 blocks over the tiny encoder's text; `extra` adds what a
    variant has (an image-to-video model's `image_dim` and `added_kv_proj_dim`). Seeded by the caller."""
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=width // 2,
        in_channels=extra.pop("in_channels", 16),
        out_channels=extra.pop("out_channels", 16),
        text_dim=_TEXT_WIDTH,
        freq_dim=32,
        ffn_dim=48,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        **extra,
    )


def _text_encoder(vocab_size: int, seed: int) -> UMT5EncoderModel:
    torch.manual_seed(seed)
    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=_TEXT_WIDTH,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        is_encoder_decoder=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    return UMT5EncoderModel(config).eval()


def _vae(seed: int) -> Any:
    torch.manual_seed(seed + 1)
    # diffusers' defaults are Wan 2.1's latent mean and std.
    vae: Any = AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    vae.register_to_config(sample_size=TINY_SIDE)
    return vae


def build_tiny_i2v_pipeline(seed: int = 0) -> WanImageToVideoPipeline:
    """A tiny Wan 2.1 image-to-video: the text-to-video one's parts, a transformer 52 wide taking the image's
    latents and mask beside the noise (36 channels) and the image's CLIP features through its image embedder and
    the cross-attention's image keys and values (`add_k_proj`, `add_v_proj`), and a 2-layer CLIP vision encoder
    16 wide with its processor at 32 px."""
    tokenizer = tiny_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = tiny_wan_transformer(TINY_I2V_WIDTH, in_channels=36, image_dim=16, added_kv_proj_dim=TINY_I2V_WIDTH)
    torch.manual_seed(seed + 3)
    vision = CLIPVisionConfig(
        hidden_size=16,
        projection_dim=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        intermediate_size=24,
        patch_size=4,
    )
    pipe = WanImageToVideoPipeline(
        tokenizer=tokenizer,
        text_encoder=_text_encoder(len(tokenizer), seed + 2),
        vae=_vae(seed),
        scheduler=UniPCMultistepScheduler(**SCHEDULER),
        image_processor=CLIPImageProcessor(crop_size=32, size=32),
        image_encoder=CLIPVisionModelWithProjection(vision).eval(),
        transformer=transformer,
    )
    dynamic: Any = pipe  # (see build_tiny_pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_a14b_pipeline(seed: int = 0, *, image: bool = False) -> WanPipeline | WanImageToVideoPipeline:
    """A tiny Wan 2.2 A14B: two transformers (`transformer` for the high-noise steps, `transformer_2` for the
    low-noise ones, each seeded apart) switched at the model's boundary. T2V-A14B's are 36 wide; with `image`,
    I2V-A14B's are 60 wide and take the image's latents and mask beside the noise (36 channels), with no image
    embedder and no image keys and values (Wan 2.2 has no CLIP image encoder: its pipeline's `image_encoder` and
    `image_processor` are None)."""
    width, extra = (TINY_A14B_I2V_WIDTH, {"in_channels": 36}) if image else (TINY_A14B_WIDTH, {})
    tokenizer = tiny_t5_tokenizer()
    torch.manual_seed(seed)
    high = tiny_wan_transformer(width, **extra)
    torch.manual_seed(seed + 4)
    low = tiny_wan_transformer(width, **extra)
    pipeline_class = WanImageToVideoPipeline if image else WanPipeline
    pipe = pipeline_class(
        tokenizer=tokenizer,
        text_encoder=_text_encoder(len(tokenizer), seed + 2),
        vae=_vae(seed),
        scheduler=UniPCMultistepScheduler(**SCHEDULER),
        transformer=high,
        transformer_2=low,
        boundary_ratio=A14B_I2V_BOUNDARY if image else A14B_BOUNDARY,
    )
    dynamic: Any = pipe  # (see build_tiny_pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_ti2v_pipeline(seed: int = 0) -> WanPipeline:
    """A tiny Wan 2.2 TI2V-5B: a transformer 56 wide over 48 latent channels, Wan 2.2's VAE layout (a residual
    encoder and decoder over 2x2-patched pixels, 16x spatially, 48 channels; the tiny one's latent mean 0 and
    std 1), and `expand_timesteps` (each latent token's own timestep, the first frame's 0 when an image is given:
    what lets diffusers' WanImageToVideoPipeline run it without an image encoder). Not a served family's tiny
    model: the `wan` family's tests load it as a 5B pool."""
    tokenizer = tiny_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = tiny_wan_transformer(TINY_TI2V_WIDTH, in_channels=48, out_channels=48)
    torch.manual_seed(seed + 1)
    vae: Any = AutoencoderKLWan(
        base_dim=8,
        z_dim=48,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
        latents_mean=[0.0] * 48,
        latents_std=[1.0] * 48,
    )
    vae.register_to_config(sample_size=TINY_SIDE)
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=_text_encoder(len(tokenizer), seed + 2),
        transformer=transformer,
        vae=vae,
        scheduler=UniPCMultistepScheduler(**SCHEDULER),
        expand_timesteps=True,
    )
    dynamic: Any = pipe  # (see build_tiny_pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_pipeline(seed: int = 0) -> WanPipeline:
    """A tiny Wan 2.1 text-to-video: 2 blocks 44 wide, a UMT5 encoder 32 wide with its tokenizer, a 16-channel
    causal video VAE (8x spatially, 4x in time) with Wan's latent mean and std, and Wan 2.1's UniPC scheduler.
    The same seed gives the same weights. The VAE's config states the tiny default side (64)."""
    tokenizer = tiny_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = tiny_wan_transformer()
    text_encoder = _text_encoder(len(tokenizer), seed + 2)
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        transformer=transformer,
        vae=_vae(seed),
        scheduler=UniPCMultistepScheduler(**SCHEDULER),
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe
