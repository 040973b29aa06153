"""fp8 storage for a pool's denoiser: every linear's weight in e4m3 with one scale per output row, computed in the
pool's dtype, with a low-rank branch beside it that carries the pool's LoRAs (`engine.weights.branches`).

`BranchedLinear` computes `x·deq(W)ᵀ + b + ((x·Aᵀ) ⊙ s)·Bᵀ`. A (rank x in), B (out x rank) and the per-rank scales
s are buffers sized once, at `LORA_MAX_RANK`, zero-padded: a swap copies factors into them and sets s, so no
module is created or removed after loading, and the stored weight is never written (there is nothing to restore).

The quantization is torchao's (`Float8Tensor.from_hp`, per-row e4m3, as its `Float8WeightOnlyConfig` stores a
linear), kept as plain tensors: the fp8 values as the weight (so its bytes are what the memory plan and a pool's
flat move see) and torchao's float32 row scales. The matmul is not torchao's: on the CPU its weight-only path
widens the weight to float32 before the matmul, measured 1.5x (idle) to 4x (loaded) a bf16 linear at 1024 x 3072
-> 12288 on 2 EPYC cores, where widening to the compute dtype measured 0.96x to 3.1x; in float32 both are torchao's
own dequantization bit for bit. diffusers' layerwise casting (e4m3 with no scale) measured 0.92x but 0.047 relative
error on N(0, 0.02) weights against 0.038 with row scales (`bench.quantized` measures the whole slice).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import SettingsError

__all__ = ["BranchedLinear", "in_storage", "quantize_denoiser", "stored_bytes"]

logger = logging.getLogger(__name__)


class BranchedLinear(nn.Linear):
    """A linear stored in fp8 (e4m3, per-row float32 scales) with a zero-padded low-rank branch of `rank`.

    A subclass of `nn.Linear` so that every table indexing a pipeline's linears (`TargetTable`) finds it under the
    same name; its `weight` is the fp8 values, never written after loading.
    """

    weight_scale: torch.Tensor
    lora_down: torch.Tensor
    lora_up: torch.Tensor
    lora_scales: torch.Tensor

    def __init__(self, linear: nn.Linear, rank: int, dtype: torch.dtype) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        values, scale = _quantize(linear.weight.detach())
        # A buffer, not a parameter: diffusers' `ModelMixin.dtype` is the first floating parameter's, and its FLUX.2
        # pipelines cast the latents to it (`latents.to(self.transformer.dtype)`), which an fp8 weight made e4m3.
        self.register_buffer("weight", values)
        self.register_buffer("weight_scale", scale)
        self.bias = linear.bias
        device = values.device
        self.register_buffer("lora_down", torch.zeros(rank, self.in_features, dtype=dtype, device=device))
        self.register_buffer("lora_up", torch.zeros(self.out_features, rank, dtype=dtype, device=device))
        self.register_buffer("lora_scales", torch.zeros(rank, dtype=dtype, device=device))
        # Ranks the branch holds now (the rest of the buffers is zero); read by swaps only, never in `forward`.
        self.branch_rank = 0

    @property
    def rank(self) -> int:
        return self.lora_down.shape[0]

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The stored weight in `dtype`: torchao's dequantization, in `dtype` (in float32: bit for bit)."""
        return self.weight.to(dtype) * self.weight_scale.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.dequantized(x.dtype), self.bias)
        hidden = F.linear(x, self.lora_down) * self.lora_scales
        return base + F.linear(hidden, self.lora_up)

    @torch.no_grad()
    def load_branch(self, parts: list[tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        """Hold exactly these (down, up, scale) factors, packed from rank 0, the rest zero; the caller has checked
        that their ranks fit `rank`."""
        offset = 0
        for down, up, scale in parts:
            end = offset + down.shape[0]
            self.lora_down[offset:end].copy_(down, non_blocking=True)
            self.lora_up[:, offset:end].copy_(up, non_blocking=True)
            self.lora_scales[offset:end].fill_(scale)
            offset = end
        if offset < self.branch_rank:
            self.lora_down[offset : self.branch_rank].zero_()
            self.lora_up[:, offset : self.branch_rank].zero_()
            self.lora_scales[offset : self.branch_rank].zero_()
        self.branch_rank = offset


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 row scales) of `weight`, as torchao's weight-only float8 stores a linear's weight."""
    from torchao.quantization import Float8Tensor, PerRow  # imported only where a pool is quantized: it is slow

    quantized = Float8Tensor.from_hp(weight, float8_dtype=torch.float8_e4m3fn, granularity=PerRow())
    return quantized.qdata, quantized.scale


@torch.no_grad()
def quantize_denoiser(denoiser: nn.Module, *, rank: int, dtype: torch.dtype) -> dict[str, BranchedLinear]:
    """Replace every `nn.Linear` of `denoiser` by a `BranchedLinear` of branch rank `rank` in `dtype`, one at a
    time (the widest weight is the only one held twice); returns them by module name."""
    names = [name for name, module in denoiser.named_modules() if type(module) is nn.Linear]
    branched: dict[str, BranchedLinear] = {}
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = denoiser.get_submodule(parent_name)
        branched[name] = BranchedLinear(getattr(parent, child), rank, dtype)
        setattr(parent, child, branched[name])
    logger.info("denoiser quantized to fp8: %d linears, branches of rank %d", len(branched), rank)
    return branched


def in_storage(pipe: Any, denoiser: str, dtype: torch.dtype, storage: str, rank: int) -> tuple[Any, torch.dtype | None]:
    """The pipeline with its `denoiser` attribute in `storage` ("native" or "fp8" with branches of `rank`), and the
    cast to `dtype` still to make as it is placed (None: none)."""
    # Casting only when needed: diffusers warns on a cast that may break modules kept in float32.
    cast = None if pipe.dtype == dtype else dtype
    if storage == "native":
        return pipe, cast
    if storage != "fp8":
        raise SettingsError(f"weight storage {storage!r} is not offered; accepted: native, fp8")
    # Cast in host memory first (a cast after would widen the fp8 weights again), then quantize there.
    pipe = pipe if cast is None else pipe.to(dtype=cast)
    quantize_denoiser(getattr(pipe, denoiser), rank=rank, dtype=dtype)
    return pipe, None


def stored_bytes(denoiser: nn.Module) -> dict[str, bytes]:
    """The bytes of every stored weight and row scale of `denoiser`'s quantized linears (what must never change)."""
    return {
        f"{name}.{part}": getattr(module, part).detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        for name, module in denoiser.named_modules()
        if isinstance(module, BranchedLinear)
        for part in ("weight", "weight_scale")
    }
