"""Tiny random-weight SDXL and SD 1.5 pipelines, built offline and deterministically.

The SDXL one has SDXL's real structure (a `text_time` UNet with cross-attention blocks laid
out like SDXL's, `CLIPTextModel` + `CLIPTextModelWithProjection`, a VAE, two CLIP
tokenizers), so LoRAs in every SDXL naming scheme load into it, but it is small
enough that a 64x64, 2-step image takes a fraction of a second on a CPU. Tests
use it, and so does the offline demo when no real model can be had. The SD 1.5
one has SD 1.5's structure in the same way (cross-attention in the first down
blocks, one transformer block per attention, convolutional `proj_in`, one
`CLIPTextModel`), with a cross-attention width of its own, so a LoRA's shapes
tell the two apart as they tell real SDXL and SD 1.5 apart.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKL,
    EulerDiscreteScheduler,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

__all__ = [
    "TINY_SIDE",
    "build_tiny",
    "build_tiny_pipeline",
    "build_tiny_sd15_pipeline",
    "ensure_tiny_pipeline",
    "tiny_tokenizer",
]

logger = logging.getLogger(__name__)

TINY_SIDE = 64
_FORMAT = 1
_MARKER = "switchboard_tiny.json"
# Names as in engine.settings.TINY_MODEL_IDS (kept literal: settings must not import torch).
_SDXL, _SD15 = "tiny", "tiny-sd15"
# SD 1.5's cross-attention width differs from SDXL's (768 vs 2048); the tiny ones differ too.
_SD15_CROSS_DIM = 48
# What both tiny UNets share; their blocks, heads and conditioning are their family's.
_UNET_SHAPE: dict[str, Any] = {
    "sample_size": TINY_SIDE // 2,
    "in_channels": 4,
    "out_channels": 4,
    "block_out_channels": (32, 64),
    "layers_per_block": 2,
    "norm_num_groups": 8,
}
# Words that get whole-word tokens, so demo prompts tokenize like real ones;
# anything else falls back to byte-level tokens.
_WORDS = (
    "a an the of in on at with and by for to from photo portrait painting drawing sketch render style "
    "cat dog bird fox horse elephant lion tiger bear owl fish dragon robot astronaut knight wizard "
    "woman man girl boy child person face city forest mountain river lake ocean sea sky space moon sun "
    "star night day sunset sunrise snow rain fog castle house street garden flower tree car ship train "
    "red orange yellow green blue purple pink black white gold silver neon pastel dark bright colorful "
    "cinematic lighting detailed highly realistic photorealistic anime cartoon pixel art watercolor oil "
    "ink pencil 3d isometric minimal vintage retro futuristic cyberpunk steampunk fantasy epic cute "
    "wrong blurry ugly low quality best masterpiece lora trigger sks ohwx tok"
).split()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte-to-printable-character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    symbols = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for token in symbols + [s + "</w>" for s in symbols]:
        vocab[token] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pair = (parts[0], parts[1])
            joined = parts[0] + parts[1]
            if pair not in merges:
                merges.append(pair)
                vocab.setdefault(joined, len(vocab))
            parts = [joined, *parts[2:]]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return vocab, merges


def tiny_tokenizer(pad_token: str = "<|endoftext|>") -> CLIPTokenizer:
    vocab, merges = _vocab_and_merges()
    # Built from files a tokenizer reports model_max_length 1e30, which makes the pipeline overflow.
    # transformers' annotation says merges are strings; its BPE takes the (first, second) pairs built here.
    return CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token, model_max_length=77)  # type: ignore[arg-type]


def _text_config(vocab_size: int, bos: int, eos: int) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=32,
        hidden_act="gelu",
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
    )


def build_tiny_pipeline(seed: int = 0) -> StableDiffusionXLPipeline:
    """Build the tiny pipeline in memory; the same seed gives the same weights."""
    tokenizer = tiny_tokenizer()
    tokenizer_2 = tiny_tokenizer(pad_token="!")
    config = _text_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        **_UNET_SHAPE,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        transformer_layers_per_block=(1, 2),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
        cross_attention_dim=64,
    )
    vae = _tiny_vae(seed)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(config)
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(config)
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=_tiny_scheduler(),
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_sd15_pipeline(seed: int = 0) -> StableDiffusionPipeline:
    """The tiny SD 1.5 pipeline in memory (no safety checker); the same seed gives the same weights."""
    tokenizer = tiny_tokenizer()
    config = _text_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    config.hidden_size = _SD15_CROSS_DIM
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        **_UNET_SHAPE,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=4,
        cross_attention_dim=_SD15_CROSS_DIM,
    )
    vae = _tiny_vae(seed)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(config)
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=_tiny_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    dynamic: Any = pipe
    dynamic.set_progress_bar_config(disable=True)
    return pipe


def build_tiny(model_id: str, seed: int = 0) -> StableDiffusionXLPipeline | StableDiffusionPipeline:
    """The tiny pipeline named `tiny` (SDXL) or `tiny-sd15`."""
    if model_id == _SDXL:
        return build_tiny_pipeline(seed)
    if model_id == _SD15:
        return build_tiny_sd15_pipeline(seed)
    raise ValueError(f"{model_id!r} is not a tiny model; accepted: {_SDXL}, {_SD15}")


def _tiny_vae(seed: int) -> AutoencoderKL:
    torch.manual_seed(seed + 1)
    return AutoencoderKL(
        block_out_channels=(16, 32),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=TINY_SIDE,
    )


def _tiny_scheduler() -> EulerDiscreteScheduler:
    return EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
        steps_offset=1,
    )


def ensure_tiny_pipeline(folder: Path, seed: int = 0, model_id: str = _SDXL) -> Path:
    """Save a tiny pipeline (`tiny` or `tiny-sd15`) as an ordinary diffusers folder, once; return the folder."""
    folder = Path(folder)
    marker = folder / _MARKER
    # The SDXL marker predates the model name; keeping it unchanged keeps existing folders valid.
    wanted: dict[str, object] = {"format": _FORMAT, "seed": seed}
    if model_id != _SDXL:
        wanted["model"] = model_id
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return folder
    logger.info("building the tiny pipeline %s (seed %d) in %s", model_id, seed, folder)
    pipe: Any = build_tiny(model_id, seed)
    pipe.save_pretrained(folder, safe_serialization=True)
    marker.write_text(json.dumps(wanted))
    return folder
