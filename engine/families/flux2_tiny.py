"""A tiny FLUX.2 [klein] built locally: its real structure (double and single blocks, the SwiGLU MLP, shared
modulations, Qwen3ForCausalLM read at three layers, the batch-normalised 32-channel VAE) at a width no other tiny
pipeline has (56), so LoRA shapes tell it apart from the tiny FLUX.1 (32) as they tell the real ones apart.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
from transformers import Qwen3Config, Qwen3ForCausalLM

from engine.families.tiny import TINY_SIDE, tiny_qwen_tokenizer

__all__ = ["TINY_TRANSFORMER", "build_tiny_pipeline", "tiny_flux2_vae"]

# The tiny transformer: 2 double and 2 single blocks 56 wide (2 heads of 28, RoPE over klein's 4 axes), FLUX.2's
# 128 packed input channels (the VAE's 32 in 2x2 patches), no guidance embedding (klein has none).
TINY_TRANSFORMER: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": 28,
    "num_attention_heads": 2,
    # The pipeline stacks Qwen3's hidden states of layers 9, 18 and 27: three times the encoder's width.
    "joint_attention_dim": 3 * 32,
    "timestep_guidance_channels": 32,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (6, 6, 8, 8),
    "guidance_embeds": False,
}


def tiny_flux2_vae(seed: int) -> AutoencoderKLFlux2:
    torch.manual_seed(seed + 1)
    return AutoencoderKLFlux2(
        block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        latent_channels=32,
        norm_num_groups=8,
        sample_size=TINY_SIDE,
    )


def build_tiny_pipeline(seed: int = 0) -> Flux2KleinPipeline:
    """A tiny distilled FLUX.2 [klein] (as klein 4B, `is_distilled`): the transformer above, a Qwen3ForCausalLM 32
    wide with the 27 layers whose states the pipeline reads (tied embeddings, as Qwen3-4B) and the tiny Qwen
    tokenizer with its chat template, a 2x VAE with FLUX.2's 32 channels and batch norm, and FLUX.2's flow-match
    scheduler with dynamic shifting (the pipeline passes its own mu). About 0.6 M parameters; the same seed
    gives the same weights."""
    tokenizer = tiny_qwen_tokenizer()
    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(**TINY_TRANSFORMER)
    vae = tiny_flux2_vae(seed)
    torch.manual_seed(seed + 2)
    text_encoder = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=27,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True)
    pipe = Flux2KleinPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=True,
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe
