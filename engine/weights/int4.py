"""int4 storage for a pool's denoiser (`QUANTIZE=int4`): every linear's weight as 4-bit codes with one scale and
one zero per group of `INT4_GROUP_SIZE` input values, computed in the pool's dtype, with the same low-rank branch
beside it as fp8's (`engine.weights.quantized.BranchedLinear`, whose swaps, padding and refusals it shares).

The quantization is torchao's int4 weight-only one (tinygemm's asymmetric codes 0..15 with float zeros: its
`_choose_qparams_affine_tinygemm` and `_quantize_affine_tinygemm`, as `Int4OpaqueTensor.from_hp` quantizes for
the CPU kernel and `Int4TilePackedTo4dTensor` for CUDA's tinygemm), kept as plain tensors: two codes a byte,
row-major (the even column in the low nibble), and the scales and zeros (rows x groups) in the compute dtype.
torchao's own tensors hold packs made for one kernel: the CPU's (`_convert_weight_to_int4pack_for_cpu`, laid out
for the CPU's vector width) or CUDA's (made on the GPU, compute capability 8.0 or later); a pool is quantized in
host RAM and then moved by flat copies (and back, taking turns), so its stored bytes must read the same on every
device. Widened, a code is `(q - 8) · scale + zero` in the compute dtype: torchao's `_dequantize_affine_tinygemm`
bit for bit.

Eager on the CPU the weight is widened 512 rows at a time into the scratch fp8's forward reads while it is in
cache, the branch riding in the same matmul (`BranchedLinear._forward_in_chunks`); compiled or on a GPU, the
plain formula (one widened copy of the weight, `DEQUANTIZED_COPIES`), which inductor fuses. Linears whose input
width the group size does not divide stay in the compute dtype, with a branch, as torchao's `quantize_` skips
them, and so do those whose outputs torchao's CPU pack refuses (not a multiple of 16) and those the family names
(`FamilySpec.keep_dtype_linears`). Why int4 this way and not bitsandbytes NF4 or torchao's kernels:
docs/internals.md, "engine/weights/int4.py".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from engine.weights.quantized import BranchedLinear, in_storage

__all__ = ["GROUP_SIZES", "Int4Linear", "in_storage_or_int4", "int4_codes", "quantize_denoiser_int4"]

logger = logging.getLogger(__name__)

# The group sizes torchao's int4 CPU kernel takes (`Int4OpaqueTensor`); CUDA's tinygemm also takes 256.
GROUP_SIZES = (32, 64, 128)
_QUANT_MAX = 15
_MID = 8  # tinygemm's mid-point: a code q stands for (q - 8) · scale + zero
_EPS = 1e-6  # torchao's floor on a group's scale (`Int4OpaqueTensor.from_hp`)
# Output rows torchao's CPU int4 pack takes a multiple of (`_convert_weight_to_int4pack_for_cpu`; CUDA's: 8).
_ROWS_MULTIPLE = 16


def int4_codes(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes 0..15 as uint8, scales, zeros) of `weight` (out x in), groups of `group_size` along each row:
    torchao's tinygemm quantization, with the arguments its CPU int4 tensor passes (scales and zeros in the
    weight's dtype, rows x groups)."""
    # Imported only where a pool is quantized: torchao is slow to import.
    from torchao.quantization.quant_primitives import (
        MappingType,
        _choose_qparams_affine_tinygemm,
        _quantize_affine_tinygemm,
    )

    block = [1, group_size]
    scale, zero = _choose_qparams_affine_tinygemm(
        weight, MappingType.ASYMMETRIC, block, torch.int32, 0, _QUANT_MAX, _EPS, None, weight.dtype
    )
    codes = _quantize_affine_tinygemm(weight, block, scale, zero, torch.int32, 0, _QUANT_MAX)
    rows = weight.shape[0]
    return codes.to(torch.uint8), scale.reshape(rows, -1), zero.reshape(rows, -1)


class Int4Linear(BranchedLinear):
    """A linear stored in int4 (two codes a byte, a scale and a zero per group) with a zero-padded low-rank branch.

    `weight` is a shape-only stand-in on the meta device (out x in, one byte a value as fp8's), for the tables that
    check a LoRA's factors against a weight's shape; the stored bytes are `weight_packed`, `weight_scale` and
    `weight_zero`, never written after loading.
    """

    STORED = ("weight_packed", "weight_scale", "weight_zero")
    weight_packed: torch.Tensor
    weight_zero: torch.Tensor

    def __init__(self, linear: nn.Linear, rank: int, dtype: torch.dtype, *, group_size: int) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group_size = group_size
        codes, scale, zero = int4_codes(linear.weight.detach(), group_size)
        self.register_buffer("weight_packed", codes[:, 0::2] | (codes[:, 1::2] << 4))
        self.register_buffer("weight_scale", scale)
        self.register_buffer("weight_zero", zero)
        self.bias = linear.bias
        device = codes.device
        self.register_buffer("lora_down", torch.zeros(rank, self.in_features, dtype=dtype, device=device))
        self.register_buffer("lora_up", torch.zeros(self.out_features, rank, dtype=dtype, device=device))
        self.register_buffer("lora_scales", torch.zeros(rank, dtype=dtype, device=device))
        self.branch_rank = 0
        self._bits_fit = True  # the chunked CPU forward widens any code (`_widened`)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        return torch.empty(self.out_features, self.in_features, dtype=torch.uint8, device="meta")

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The stored weight in `dtype`: torchao's tinygemm dequantization in `dtype`, bit for bit."""
        out = torch.empty(self.out_features, self.in_features, dtype=dtype, device=self.weight_packed.device)
        return self._widened(0, self.out_features, dtype, out)

    def _widened(self, start: int, end: int, dtype: torch.dtype, scratch: torch.Tensor) -> torch.Tensor:
        """Rows `start:end` of the weight in `dtype`, written into `scratch` (of `dtype`'s width): the two nibbles
        of each byte interleaved, less the mid-point, times the group's scale, plus its zero (two roundings, as
        torchao's `_dequantize_affine_tinygemm` makes them)."""
        packed = self.weight_packed[start:end]
        rows = end - start
        out = scratch.view(dtype)
        pairs = out.view(rows, self.in_features // 2, 2)
        pairs[..., 0].copy_(packed & 0xF)
        pairs[..., 1].copy_(packed >> 4)
        groups = out.sub_(_MID).view(rows, -1, self.group_size)
        groups.mul_(self.weight_scale[start:end, :, None].to(dtype))
        groups.add_(self.weight_zero[start:end, :, None].to(dtype))
        return out


def group_size_for(linear: nn.Linear, group_size: int) -> int | None:
    """The group size `linear` is quantized with: `group_size`, or None (kept in the compute dtype) where it does
    not divide the input width (torchao's `quantize_` skips such a weight) or the outputs are not a multiple of
    `_ROWS_MULTIPLE` (torchao's CPU int4 pack refuses them)."""
    fits = linear.in_features % group_size == 0 and linear.out_features % _ROWS_MULTIPLE == 0
    return group_size if fits else None


@torch.no_grad()
def quantize_denoiser_int4(
    denoiser: nn.Module, *, rank: int, dtype: torch.dtype, group_size: int, keep: Sequence[str] = ()
) -> dict[str, BranchedLinear]:
    """Replace every `nn.Linear` of `denoiser` by an `Int4Linear` (a `BranchedLinear` kept in `dtype` where
    `keep` matches its name or `group_size` does not divide its width), one at a time. Returns them by name."""
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size {group_size} is not one torchao's CPU kernel takes: {GROUP_SIZES}")
    names = [name for name, module in denoiser.named_modules() if type(module) is nn.Linear]
    kept = [re.compile(pattern) for pattern in keep]
    branched: dict[str, BranchedLinear] = {}
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = denoiser.get_submodule(parent_name)
        linear = getattr(parent, child)
        size = None if any(p.search(name) for p in kept) else group_size_for(linear, group_size)
        branched[name] = (
            BranchedLinear(linear, rank, dtype, quantize=False)
            if size is None
            else Int4Linear(linear, rank, dtype, group_size=size)
        )
        setattr(parent, child, branched[name])
    unquantized = sum(not isinstance(m, Int4Linear) for m in branched.values())
    logger.info(
        "denoiser quantized to int4 (groups of %d): %d linears (%d kept in %s), branches of rank %d",
        group_size,
        len(branched),
        unquantized,
        dtype,
        rank,
    )
    return branched


def in_storage_or_int4(
    pipe: Any, denoiser: str, dtype: torch.dtype, storage: str, rank: int, keep: Sequence[str], group_size: int
) -> tuple[Any, torch.dtype | None]:
    """`engine.weights.quantized.in_storage`, and "int4": the pipeline cast to `dtype` in host memory, then its
    `denoiser` quantized to int4 in groups of `group_size` with branches of `rank` (None: no cast left to make)."""
    if storage != "int4":
        return in_storage(pipe, denoiser, dtype, storage, rank, keep)
    pipe, cast = in_storage(pipe, denoiser, dtype, "native", rank, keep)
    pipe = pipe if cast is None else pipe.to(dtype=cast)
    quantize_denoiser_int4(getattr(pipe, denoiser), rank=rank, dtype=dtype, group_size=group_size, keep=keep)
    return pipe, None
