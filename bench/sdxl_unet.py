"""The full-size SDXL UNet with random weights, built in seconds and reproducible without a copy.

Construction happens on the `meta` device, so no memory is touched until the
weights are allocated once, in the benchmark's dtype. Every tensor is then
filled with a slice of one small random pool, at an offset fixed by its
position in the module; the expected value of any tensor can therefore be
regenerated from the pool at any time, which is how exactness is checked
without holding a second copy of 2.6 billion weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from diffusers import UNet2DConditionModel
from torch import nn

__all__ = [
    "POOL_SIZE",
    "SDXL_UNET_CONFIG",
    "build_filled",
    "build_sdxl_unet",
    "default_dtype",
    "drift_from_fill",
    "fill_module",
    "mismatched_tensors",
    "random_pool",
]

# stabilityai/stable-diffusion-xl-base-1.0, unet/config.json (the fields that differ from diffusers' defaults).
SDXL_UNET_CONFIG: dict[str, Any] = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "block_out_channels": (320, 640, 1280),
    "layers_per_block": 2,
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    "attention_head_dim": (5, 10, 20),
    "transformer_layers_per_block": (1, 2, 10),
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
    "cross_attention_dim": 2048,
    "norm_num_groups": 32,
}

# Larger than SDXL's largest tensor (an up block's 2560 -> 1280 3x3 convolution, 29.5M values).
POOL_SIZE = 1 << 25
_STRIDE = 7_919 * 1_009  # spreads consecutive tensors over the pool


def random_pool(seed: int = 0, size: int = POOL_SIZE, std: float = 0.02) -> torch.Tensor:
    """The float32 values every tensor of a filled module is cut from."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, generator=generator) * std


def _tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


def _slice(pool: torch.Tensor, index: int, tensor: torch.Tensor) -> torch.Tensor:
    numel = tensor.numel()
    if numel > pool.numel():
        raise ValueError(f"a tensor of {numel} values does not fit a pool of {pool.numel()}; accepted: a larger pool")
    offset = (index * _STRIDE) % (pool.numel() - numel + 1)
    return pool[offset : offset + numel].view(tensor.shape)


class _PoolCasts:
    """The pool converted once per device and dtype it is needed in."""

    def __init__(self, pool: torch.Tensor) -> None:
        self._pool = pool
        self._casts: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def like(self, tensor: torch.Tensor) -> torch.Tensor:
        key = (tensor.device, tensor.dtype)
        if key not in self._casts:
            self._casts[key] = self._pool.to(device=tensor.device, dtype=tensor.dtype)
        return self._casts[key]


def _as_bits(tensor: torch.Tensor) -> torch.Tensor:
    # Compared as integers: bit-exact (-0.0 differs from 0.0) and several times faster than a bfloat16 compare.
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.view(bits)


@torch.no_grad()
def fill_module(module: nn.Module, pool: torch.Tensor) -> None:
    """Give every parameter and buffer of `module` its slice of `pool`, rounded to the tensor's dtype."""
    cast = _PoolCasts(pool)
    for index, (_, tensor) in enumerate(_tensors(module)):
        tensor.copy_(_slice(cast.like(tensor), index, tensor))


@torch.no_grad()
def mismatched_tensors(module: nn.Module, pool: torch.Tensor) -> list[str]:
    """Names of the parameters and buffers that are not bit-equal to what `fill_module` put there."""
    cast = _PoolCasts(pool)
    bad = []
    for index, (name, tensor) in enumerate(_tensors(module)):
        if not torch.equal(_as_bits(tensor), _as_bits(_slice(cast.like(tensor), index, tensor))):
            bad.append(name)
    return bad


@torch.no_grad()
def drift_from_fill(module: nn.Module, pool: torch.Tensor) -> tuple[float, int]:
    """The largest absolute difference from what `fill_module` put there, and how many tensors differ at all."""
    cast = _PoolCasts(pool)
    largest, differing = 0.0, 0
    for index, (_, tensor) in enumerate(_tensors(module)):
        expected = _slice(cast.like(tensor), index, tensor)
        if not torch.equal(_as_bits(tensor), _as_bits(expected)):
            differing += 1
            largest = max(largest, float((tensor.float() - expected.float()).abs().max()))
    return largest, differing


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    # Creating the modules in `dtype` (instead of casting afterwards) keeps diffusers from warning
    # about modules it would keep in float32 when loading a checkpoint; this UNet has none.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_filled(model_class: Any, config: dict[str, Any], *, dtype: torch.dtype, device: torch.device, pool) -> Any:
    """A diffusers model of `config`, made on the meta device, allocated once in `dtype`, filled from `pool`."""
    with torch.device("meta"), default_dtype(dtype):
        model = model_class.from_config(dict(config))
    model = model.to_empty(device=device)
    fill_module(model, pool)
    model.requires_grad_(False)
    return model.eval()


def build_sdxl_unet(
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    pool: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> UNet2DConditionModel:
    """SDXL's UNet (or another `config`) with every tensor filled from `pool`, ready for inference-free benchmarks."""
    return build_filled(
        UNet2DConditionModel,
        config if config is not None else SDXL_UNET_CONFIG,
        dtype=dtype,
        device=torch.device(device),
        pool=pool if pool is not None else random_pool(),
    )
