"""A tiny LTX-2, built locally from nothing downloaded: its audio-video transformer, the text connectors, a
Gemma 3 text encoder with a byte-level tokenizer, a video VAE, an audio VAE and a vocoder, and a flow-matching
scheduler.

Kept apart from `engine.families.ltx2` (the family's declaration) so that each stays small. The structure is
LTX-2's (blocks of video and audio self-attention, text cross-attention, audio-to-video and video-to-audio
attention and feed-forwards; connectors over every Gemma layer's hidden states), its sizes a CPU's, after
diffusers' own tiny LTX-2 (tests/pipelines/ltx2/testing_utils.py): a VAE 2x spatially and in time (its frames are
`FRAME_MULTIPLE`k+1 as the real model's 8k+1 are), and a vocoder whose upsampling is the mel hop (160), so that
its waveform runs at its stated rate (16 kHz) for the clip's duration as the real one does (24 kHz).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    FlowMatchEulerDiscreteScheduler,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, PreTrainedTokenizerFast

from engine.families.tiny import TINY_SIDE, byte_level_tokenizer

__all__ = ["TINY_FRAMES", "TINY_RATE", "TINY_WIDTH", "build_tiny_pipeline", "tiny_gemma_tokenizer"]

# The tiny transformer's video width: 2 heads of 42 (a width no other tiny pipeline has, so widths tell the tiny
# ones apart as they tell the real ones); its audio stream's: 2 heads of 6.
TINY_WIDTH = 84
_AUDIO_WIDTH = 12
# The tiny Gemma's width, which its connectors keep (4 heads of 8).
_TEXT_WIDTH = 32
# The tiny pool's default frames (2k+1 for its VAE, 8k+1 as LTX-2's: 2 x 8 + 1) and its vocoder's rate.
TINY_FRAMES = 9
TINY_RATE = 16_000
_SPECIALS = ("<pad>", "<eos>", "<bos>")


def tiny_gemma_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer over the tiny pipelines' vocabulary with Gemma's pad, BOS and EOS roles, padding on
    the left as LTX-2's pipelines pad Gemma's prompts (`LTX2InContextPipeline` reads the side once, when built)."""
    return PreTrainedTokenizerFast(
        padding_side="left",
        tokenizer_object=byte_level_tokenizer(_SPECIALS),
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        model_max_length=1024,
    )


def _text_encoder(tokenizer: PreTrainedTokenizerFast, seed: int) -> Gemma3ForConditionalGeneration:
    """Gemma 3 32 wide, 2 layers (4 heads of 8, 2 key-value heads), with a one-layer vision tower its class needs."""
    torch.manual_seed(seed)
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": _TEXT_WIDTH,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 1024,
            "sliding_window": 64,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 4,
        },
        mm_tokens_per_image=4,
    )
    return Gemma3ForConditionalGeneration(config).eval()


# LTX-2.5's differences from 2.0, as diffusers 0.42.1 builds them (models/transformers/transformer_ltx2.py): 2.3's
# prompt path (no `caption_projection`, `use_prompt_embeddings`; per-modality connector projections) and cross-
# attention modulation, without its timestep MLP (`use_prompt_adaln_single`), without feed-forward biases, with the
# keyframe position embedding.
_TRANSFORMER_2_5 = {
    "use_prompt_embeddings": False,
    "cross_attn_mod": True,
    "audio_cross_attn_mod": True,
    "use_prompt_adaln_single": False,
    "ff_bias": False,
    "use_keyframes_abs_pos_embedding": True,
}
# Its connectors project into each stream's width and run there (2.3's `per_modality_projections`).
_CONNECTORS_2_5 = {
    "per_modality_projections": True,
    "video_hidden_dim": TINY_WIDTH,
    "video_connector_num_attention_heads": 2,
    "video_connector_attention_head_dim": TINY_WIDTH // 2,
    "audio_hidden_dim": _AUDIO_WIDTH,
    "audio_connector_num_attention_heads": 2,
    "audio_connector_attention_head_dim": _AUDIO_WIDTH // 2,
}


def _transformer(**differences: Any) -> LTX2VideoTransformer3DModel:
    return LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=TINY_WIDTH // 2,
        cross_attention_dim=TINY_WIDTH,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=_AUDIO_WIDTH // 2,
        audio_cross_attention_dim=_AUDIO_WIDTH,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=_TEXT_WIDTH,
        rope_double_precision=False,
        rope_type="split",
        **differences,
    )


def _connectors(**differences: Any) -> LTX2TextConnectors:
    settings: dict[str, Any] = dict(
        caption_channels=_TEXT_WIDTH,
        text_proj_in_factor=3,  # the tiny Gemma's 2 layers and its embeddings
        video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )
    return LTX2TextConnectors(**(settings | differences))


def _vaes() -> tuple[Any, AutoencoderKLLTX2Audio, LTX2Vocoder]:
    # LTX-2's video VAE layout (4x4 patches, then spatial, temporal and two spatio-temporal downsamplings: 32x
    # spatially, 8x in time), 8 channels a block.
    vae: Any = AutoencoderKLLTX2Video(
        latent_channels=4,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        upsample_residual=(False, False, False),
        upsample_factor=(1, 1, 1),
        decoder_causal=False,
        spatial_compression_ratio=32,
        temporal_compression_ratio=8,
    )
    vae.register_to_config(sample_size=TINY_SIDE)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=TINY_RATE,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    )
    vocoder = LTX2Vocoder(
        in_channels=2 * 8,
        hidden_channels=32,
        out_channels=2,
        # 4 x 4 x 10: the mel hop, so 100 mel frames make a second at 16 kHz.
        upsample_kernel_sizes=[8, 8, 20],
        upsample_factors=[4, 4, 10],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=TINY_RATE,
    )
    return vae, audio_vae, vocoder


def build_tiny_pipeline(seed: int = 0, *, ltx2_5: bool = False) -> LTX2Pipeline:
    """A tiny LTX-2 text-to-video with sound: a transformer 84 wide over video and 12 wide over audio, 2 blocks;
    connectors and a Gemma 3 encoder 32 wide with its tokenizer; the video VAE (4 channels, 2x), the audio VAE
    (8 mel bins) and a 16 kHz stereo vocoder; diffusers' flow-matching scheduler. The same seed gives the same
    weights. The video VAE's config states the tiny default side (64). `ltx2_5`: LTX-2.5's transformer and
    connectors (`_TRANSFORMER_2_5`), over the same Gemma 3 (a tiny Gemma 4 would change no LoRA's layer)."""
    tokenizer = tiny_gemma_tokenizer()
    text_encoder = _text_encoder(tokenizer, seed + 2)
    torch.manual_seed(seed)
    transformer = _transformer(**(_TRANSFORMER_2_5 if ltx2_5 else {}))
    torch.manual_seed(seed + 3)
    connectors = _connectors(**(_CONNECTORS_2_5 if ltx2_5 else {}))
    torch.manual_seed(seed + 1)
    vae, audio_vae, vocoder = _vaes()
    pipe = LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe
