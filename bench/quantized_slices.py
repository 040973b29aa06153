"""The real-width slices `bench.quantized` measures, one per family it takes (`--family`): how each is built from
its pool of random values, its LoRA pair written, and a step's inputs made at a number of image tokens.

- `flux`: FLUX.1's transformer, 2 double and 4 single blocks at width 3072 (`bench.flux_slice`), every BFL linear
  adapted; a step: `tokens` image tokens and a quarter as many text tokens.
- `wan`: Wan's 14B video transformer (Wan 2.1 T2V-14B's, and each of Wan 2.2 A14B's two), 2 blocks at width 5120
  (`bench.wan_slice`), every block linear adapted; a step: 4 latent frames of a square latent whose 2x2 patches
  make `tokens` video tokens (1024: 4 x 32 x 32 latents, a 256 x 256 video of 13 frames), and UMT5's 512 text
  tokens (Wan's pipelines always pad the prompt to 512).
- `krea2`: Krea 2's transformer, 2 blocks at width 6144 (`bench.krea2_slice`), every block linear adapted; a step:
  `tokens` image tokens on diffusers' own position grid (`Krea2Pipeline.prepare_position_ids`) and 512 text tokens
  of Qwen3-VL's 12 tapped layers with their mask, as the pipeline pads every prompt to `max_sequence_length`
  (its template's few suffix tokens left out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import Krea2Pipeline
from torch import nn

from bench.flux_slice import build_flux_slice, flux_pool, flux_targets, write_flux_pair
from bench.krea2_slice import KREA2_SLICE_CONFIG, build_krea2_slice, krea2_pool, krea2_targets, write_krea2_pair
from bench.ours import LoraPair
from bench.wan_slice import build_wan_slice, wan_pool, wan_targets, write_wan_pair
from lora_catalog.entries import Family

__all__ = ["SLICES", "QuantizedSlice"]

_LATENT_FRAMES = 4
_WAN_TEXT_TOKENS = 512  # WanPipeline's max_sequence_length: every prompt padded to it
_KREA2_TEXT_TOKENS = 512  # Krea2Pipeline's max_sequence_length: every prompt padded to it


@dataclass(frozen=True)
class QuantizedSlice:
    label: str
    family: Family
    pool: Callable[[], torch.Tensor]
    build: Callable[..., nn.Module]
    # (folder, the slice, rank) -> the LoRA pair in diffusers' names (PEFT's metadata), as `load_lora_adapter` reads.
    pair: Callable[[Path, nn.Module, int], LoraPair]
    inputs: Callable[[int, torch.dtype], dict[str, object]]


def _flux_inputs(tokens: int, dtype: torch.dtype) -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    text = max(tokens // 4, 16)
    side = int(tokens**0.5)
    grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(tokens // side), indexing="ij"), -1)
    image_ids = torch.cat([torch.zeros(side * (tokens // side), 1), grid.reshape(-1, 2).float()], dim=1)
    return {
        "hidden_states": torch.randn(1, image_ids.shape[0], 64, generator=generator).to(dtype),
        "encoder_hidden_states": torch.randn(1, text, 4096, generator=generator).to(dtype),
        "pooled_projections": torch.randn(1, 768, generator=generator).to(dtype),
        "timestep": torch.tensor([0.5], dtype=dtype),
        "img_ids": image_ids,
        "txt_ids": torch.zeros(text, 3),
        "guidance": torch.tensor([3.5], dtype=dtype),
        "return_dict": False,
    }


def _wan_inputs(tokens: int, dtype: torch.dtype) -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    side = 2 * max(1, round((tokens / _LATENT_FRAMES) ** 0.5))
    return {
        "hidden_states": torch.randn(1, 16, _LATENT_FRAMES, side, side, generator=generator).to(dtype),
        "encoder_hidden_states": torch.randn(1, _WAN_TEXT_TOKENS, 4096, generator=generator).to(dtype),
        "timestep": torch.tensor([500.0], dtype=dtype),
        "return_dict": False,
    }


def _krea2_inputs(tokens: int, dtype: torch.dtype) -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    side = int(tokens**0.5)
    layers, width = 12, 2560  # Krea2Transformer2DModel's defaults: num_text_layers, text_hidden_dim
    assert "num_text_layers" not in KREA2_SLICE_CONFIG and "text_hidden_dim" not in KREA2_SLICE_CONFIG
    text = torch.randn(1, _KREA2_TEXT_TOKENS, layers, width, generator=generator)
    return {
        "hidden_states": torch.randn(1, side * (tokens // side), 64, generator=generator).to(dtype),
        "encoder_hidden_states": text.to(dtype),
        "timestep": torch.tensor([0.5], dtype=dtype),
        "position_ids": Krea2Pipeline.prepare_position_ids(_KREA2_TEXT_TOKENS, side, tokens // side, "cpu"),
        "encoder_attention_mask": torch.ones(1, _KREA2_TEXT_TOKENS, dtype=torch.bool),
        "return_dict": False,
    }


SLICES: dict[str, QuantizedSlice] = {
    "flux": QuantizedSlice(
        "FLUX.1 transformer slice (2 double + 4 single blocks, width 3072)",
        Family.FLUX,
        flux_pool,
        build_flux_slice,
        lambda folder, model, rank: write_flux_pair(folder, flux_targets(model), rank=rank, fmt="peft"),
        _flux_inputs,
    ),
    "wan": QuantizedSlice(
        "Wan 14B transformer slice (2 blocks, width 5120)",
        Family.WAN,
        wan_pool,
        build_wan_slice,
        lambda folder, model, rank: write_wan_pair(folder, wan_targets(model), rank=rank, fmt="peft"),
        _wan_inputs,
    ),
    "krea2": QuantizedSlice(
        "Krea 2 transformer slice (2 blocks, width 6144)",
        Family.KREA2,
        krea2_pool,
        build_krea2_slice,
        lambda folder, model, rank: write_krea2_pair(folder, krea2_targets(model), rank=rank, fmt="peft"),
        _krea2_inputs,
    ),
}
