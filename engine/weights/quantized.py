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
own dequantization bit for bit on every finite code (the two NaN codes would widen to ±480·scale on the CPU's bit
path: quantizing writes neither, a row of zeros included, where torchao writes 0/0). A float16 weight is quantized
from its float32 values and widened with its float32 scales (torchao's own, bit for bit, of those values): in
float16 small rows' scales would round to subnormals. diffusers' layerwise casting (e4m3 with no scale) measured
0.92x but 0.047 relative error on N(0, 0.02) weights against 0.038 with row scales (`bench.quantized` measures the
whole slice).

Linears whose weight dtype diffusers reads (Z-Image casts the timestep embedding to `t_embedder.mlp.0`'s) are kept
in the compute dtype, each family naming them (`FamilySpec.keep_dtype_linears`), with a branch like the others.

Eager on the CPU, the weight is widened 512 rows at a time, by bit operations (torch converts fp8 one value at a
time there: 4.4 ns each), into one scratch buffer the matmul reads while it is in cache; the branch computes only
the ranks it holds. A CPU has no fp8 arithmetic, so each call still pays 4 vector passes over every weight value
(about 0.25 ns each value on one EPYC core), against a bf16 matmul's ~2 ns per value at 320 tokens: 1.2-1.3x a
bf16 linear there (one thread), 1.1-1.15x at 1280, 2-3x on a 1-token modulation linear. Compiled or on a GPU, the
plain formula below: inductor fuses the widening, a GPU hides it in memory traffic; eager, it holds one transient
copy of the weight in the compute dtype (`DEQUANTIZED_COPIES`, which the memory plan counts), and skips the branch
while it holds no rank.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import SettingsError

__all__ = [
    "DEQUANTIZED_COPIES",
    "BranchedLinear",
    "held_branches",
    "in_storage",
    "quantize_denoiser",
    "stored_bytes",
]

logger = logging.getLogger(__name__)

# Per compute dtype: the integer type of its width, and the shift and mask taking a sign-extended e4m3 byte to
# its bits (value x 2^-120); `_UNBIAS` undoes the 2^-120.
_BITS: dict[torch.dtype, tuple[torch.dtype, int, int]] = {
    torch.bfloat16: (torch.int16, 4, 0x87F0 - (1 << 16)),
    torch.float32: (torch.int32, 20, 0x87F00000 - (1 << 32)),
}
_UNBIAS = 2.0**120
# Weight rows widened at a time on the CPU: they stay in cache (L3) from the widening to the matmul reading them.
# Measured at 1-1280 tokens on 3072 x 12288: 512 rows as fast as 256-2048 or faster (fewer rows re-read the input
# more often and run oneDNN's bf16 matmul off its best shapes; 85 rows of 12288 cost 2x).
_CHUNK_ROWS = 512
# torch's CPU parallel grain (at::internal::GRAIN_SIZE): an op on fewer values runs on the calling thread.
_GRAIN = 32768
# Full-size copies of one weight in the compute dtype that the plain formula holds at once (eager, on a GPU): the
# widened weight, scaled in place.
DEQUANTIZED_COPIES = 1


class BranchedLinear(nn.Linear):
    """A linear stored in fp8 (e4m3, per-row float32 scales) with a zero-padded low-rank branch of `rank`.

    A subclass of `nn.Linear` so that every table indexing a pipeline's linears (`TargetTable`) finds it under the
    same name; its `weight` is the fp8 values, never written after loading. With `quantize=False` the weight stays
    as given, in the compute dtype (no scales): a linear whose weight dtype diffusers reads, still with a branch.
    """

    # The buffers holding the stored weight (`stored_bytes`): never written after loading.
    STORED: tuple[str, ...] = ("weight", "weight_scale")
    weight_scale: torch.Tensor
    lora_down: torch.Tensor
    lora_up: torch.Tensor
    lora_scales: torch.Tensor

    def __init__(self, linear: nn.Linear, rank: int, dtype: torch.dtype, *, quantize: bool = True) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if quantize:
            values, scale = _quantize(linear.weight.detach())
        else:
            values, scale = linear.weight.detach(), torch.empty(0, dtype=torch.float32, device=linear.weight.device)
        # A buffer, not a parameter: diffusers' `ModelMixin.dtype` is the first floating parameter's, and its FLUX.2
        # pipelines cast the latents to it (`latents.to(self.transformer.dtype)`), which an fp8 weight made e4m3.
        self.register_buffer("weight", values)
        self.register_buffer("weight_scale", scale)
        self.bias = linear.bias
        device = values.device
        self.register_buffer("lora_down", torch.zeros(rank, self.in_features, dtype=dtype, device=device))
        self.register_buffer("lora_up", torch.zeros(self.out_features, rank, dtype=dtype, device=device))
        self.register_buffer("lora_scales", torch.zeros(rank, dtype=dtype, device=device))
        # Ranks the branch holds now (the rest of the buffers is zero): set by swaps; read by the eager CPU
        # forward only (a compiled forward computes the padded rank, so that a swap never recompiles).
        self.branch_rank = 0
        # The bit widening scales rows by 2^120: row scales under 2^7 (weights under 57344) stay finite.
        self._bits_fit = bool(quantize and (scale.numel() == 0 or scale.abs().max() < 2**7))

    @property
    def rank(self) -> int:
        return self.lora_down.shape[0]

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The stored weight in `dtype`: torchao's dequantization, in `dtype` (in float32 and float16: bit for bit on
        every finite code); a weight kept unquantized, as it is (no copy in its own dtype)."""
        if self.weight.dtype != torch.float8_e4m3fn:
            return self.weight.to(dtype)
        if self.weight.device.type == "cpu" and dtype in _BITS and self._bits_fit and not torch.compiler.is_compiling():
            return self._widened(0, self.out_features, dtype, torch.empty_like(self.weight, dtype=_BITS[dtype][0]))
        # Scaled in place (one copy of the weight, `DEQUANTIZED_COPIES`). float16's row scales stay float32 (the
        # product rounded once, as torchao's): in float16 the small ones would round to subnormals.
        scale = self.weight_scale if dtype == torch.float16 else self.weight_scale.to(dtype)
        return self.weight.to(dtype).mul_(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._in_chunks(x):
            return self._forward_in_chunks(x)
        # Compiled (inductor fuses the widening into its kernels) or off the CPU: the padded branch, whose shapes
        # no swap changes, so a swap never recompiles (compiled, `branch_rank` is never read: no guard on it).
        base = F.linear(x, self.dequantized(x.dtype), self.bias)
        if not torch.compiler.is_compiling() and not self.branch_rank:
            return base  # eager with no LoRA held: a Python int, read with no device sync
        hidden = F.linear(x, self.lora_down) * self.lora_scales
        return base + F.linear(hidden, self.lora_up)

    def _in_chunks(self, x: torch.Tensor) -> bool:
        return (
            x.device.type == "cpu"
            and x.dtype in _BITS
            and x.dtype == self.lora_down.dtype
            and self._bits_fit
            and not torch.compiler.is_compiling()
            # The matmuls write into slices of one output (`out=`), which autograd refuses.
            and not (
                torch.is_grad_enabled() and (x.requires_grad or (self.bias is not None and self.bias.requires_grad))
            )
        )

    def _forward_in_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """Eager on the CPU: the weight widened a block of rows at a time into one scratch buffer that stays in
        cache for the matmul reading it (widening it whole at each call, torch's way: 4.5x a bf16 linear at 320
        tokens; this: 1.2-1.3x, one thread). The branch at the ranks it holds rides in the same matmul: the
        block's rows carry their `lora_up` rows after the weight's, the input its `(x·Aᵀ) ⊙ s` after `x`, so
        base and branch are summed in one float32 accumulator (rounded once, as a fused weight would be)."""
        flat = x.reshape(-1, self.in_features)
        out = torch.empty(flat.shape[0], self.out_features, dtype=x.dtype)
        rank = self.branch_rank
        if rank:
            flat = torch.cat([flat, F.linear(flat, self.lora_down[:rank]) * self.lora_scales[:rank]], dim=1)
        rows = min(self.out_features, _CHUNK_ROWS)
        scratch = torch.empty(rows, self.in_features + rank, dtype=_BITS[x.dtype][0])
        for start in range(0, self.out_features, rows):
            end = min(start + rows, self.out_features)
            block = scratch[: end - start]
            self._widened(start, end, x.dtype, block[:, : self.in_features])
            weight, part = block.view(x.dtype), out[:, start:end]
            if rank:
                weight[:, self.in_features :].copy_(self.lora_up[start:end, :rank])
            if self.bias is None:
                torch.mm(flat, weight.t(), out=part)
            else:
                torch.addmm(self.bias[start:end], flat, weight.t(), out=part)
        return out.view(*x.shape[:-1], self.out_features)

    def _widened(self, start: int, end: int, dtype: torch.dtype, scratch: torch.Tensor) -> torch.Tensor:
        """Rows `start:end` of the weight in `dtype`, written into `scratch` (of `_BITS[dtype]`'s integer type).

        torch widens fp8 one element at a time on the CPU (37.7 M values: 167 ms to bf16, 4.4 ns each); these
        are 4 vectorized passes. An e4m3 byte, sign-extended and shifted into place (its sign kept, the copies
        of the sign masked off the exponent), reads as the same value times 2^-120 in bf16 or float32 (their
        subnormals line up with e4m3's as its normals do); times the row scale times 2^120 (exact: a power of
        two) it is torchao's dequantization bit for bit, as `weight.to(dtype) * scale.to(dtype)` rounds it.
        """
        _, shift, mask = _BITS[dtype]
        scratch.copy_(self.weight[start:end].view(torch.int8)).bitwise_left_shift_(shift).bitwise_and_(mask)
        return scratch.view(dtype).mul_(self.weight_scale[start:end].to(dtype) * _UNBIAS)

    @torch.no_grad()
    def load_branch(self, parts: list[tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        """Hold exactly these (down, up, scale) factors, packed from rank 0, the rest zero; the caller has checked
        that their ranks fit `rank`. `branch_rank` covers every rank written before its copies start, so that a
        copy failing half-way leaves nothing a later `load_branch([])` misses."""
        offset = 0
        for down, up, scale in parts:
            end = offset + down.shape[0]
            self.branch_rank = max(self.branch_rank, end)
            _copy(self.lora_down[offset:end], down)
            _copy(self.lora_up[:, offset:end], up)
            self.lora_scales[offset:end].fill_(scale)
            offset = end
        if offset < self.branch_rank:
            _copy(self.lora_down[offset : self.branch_rank], 0.0)
            _copy(self.lora_up[:, offset : self.branch_rank], 0.0)
            self.lora_scales[offset : self.branch_rank].zero_()
        self.branch_rank = offset

    @torch.no_grad()
    def load_scales(self, parts: list[tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        """New scales for the factors the last `load_branch` wrote, in its order (a schedule's step boundary: the
        factors stay, only `lora_scales` changes; no shape, so nothing compiled is guarded on it)."""
        offset = 0
        for down, _, scale in parts:
            self.lora_scales[offset : offset + down.shape[0]].fill_(scale)
            offset += down.shape[0]


def _copy(target: torch.Tensor, source: torch.Tensor | float) -> None:
    """`target.copy_(source)` (a number: fill); on the CPU in pieces under torch's parallel grain, each on the
    calling thread: a swap's copies are small and memory-bound, and as parallel ops each waited for a descheduled
    OpenMP worker on a loaded machine (a whole slice's swap: 223 ms against 15 ms, load 2)."""
    pieces = [(target, source)]
    if target.device.type == "cpu" and target.shape[0]:
        rows = max(1, _GRAIN // (target.numel() // target.shape[0] or 1))
        pieces = [
            (target[i : i + rows], source[i : i + rows] if isinstance(source, torch.Tensor) else source)
            for i in range(0, target.shape[0], rows)
        ]
    for piece, values in pieces:
        if isinstance(values, torch.Tensor):
            piece.copy_(values, non_blocking=True)
        else:
            piece.fill_(values)


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 row scales) of `weight`, as torchao's weight-only float8 stores a linear's weight
    (but a row of zeros: see below)."""
    from torchao.quantization import Float8Tensor, PerRow  # imported only where a pool is quantized: it is slow

    # torchao divides the row maxima by 448 in the weight's dtype: in float16 small rows' scales would round to
    # subnormals (and their values saturate), so a float16 weight is quantized from its float32 values.
    source = weight.float() if weight.dtype == torch.float16 else weight
    quantized = Float8Tensor.from_hp(source, float8_dtype=torch.float8_e4m3fn, granularity=PerRow())
    values, scale = quantized.qdata, quantized.scale
    # A row of zeros gets torchao's scale 0 and values 0/0, NaN codes (its dequantization: NaN): stored as zeros
    # with scale 1, it is zeros on every path.
    empty = scale == 0
    if bool(empty.any()):
        values = values.view(torch.uint8).masked_fill(empty, 0).view(torch.float8_e4m3fn)
        scale = scale.masked_fill(empty, 1.0)
    return values, scale


@torch.no_grad()
def quantize_denoiser(
    denoiser: nn.Module, *, rank: int, dtype: torch.dtype, keep: Sequence[str] = ()
) -> dict[str, BranchedLinear]:
    """Replace every `nn.Linear` of `denoiser` by a `BranchedLinear` of branch rank `rank` in `dtype`, one at a
    time (the widest weight is the only one held twice, a float16 one also in float32 while quantized); those
    whose name matches a pattern of `keep` (`re.search`) keep their weight in `dtype`, unquantized. Returns them by
    module name."""
    names = [name for name, module in denoiser.named_modules() if type(module) is nn.Linear]
    kept = [re.compile(pattern) for pattern in keep]
    branched: dict[str, BranchedLinear] = {}
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = denoiser.get_submodule(parent_name)
        quantize = not any(pattern.search(name) for pattern in kept)
        branched[name] = BranchedLinear(getattr(parent, child), rank, dtype, quantize=quantize)
        setattr(parent, child, branched[name])
    unquantized = sum(m.weight.dtype != torch.float8_e4m3fn for m in branched.values())
    logger.info(
        "denoiser quantized to fp8: %d linears (%d kept in %s), branches of rank %d",
        len(branched),
        unquantized,
        dtype,
        rank,
    )
    return branched


def in_storage(
    pipe: Any, denoiser: str, dtype: torch.dtype, storage: str, rank: int, keep: Sequence[str] = ()
) -> tuple[Any, torch.dtype | None]:
    """The pipeline with its `denoiser` attribute in `storage` ("native" or "fp8" with branches of `rank`, the
    linears `keep` matches in `dtype`), and the cast to `dtype` still to make as it is placed (None: none)."""
    # Casting only when needed: diffusers warns on a cast that may break modules kept in float32.
    cast = None if pipe.dtype == dtype else dtype
    if storage == "native":
        return pipe, cast
    if storage != "fp8":
        raise SettingsError(f"weight storage {storage!r} is not offered; accepted: native, fp8")
    # Cast in host memory first (a cast after would widen the fp8 weights again), then quantize there.
    pipe = pipe if cast is None else pipe.to(dtype=cast)
    quantize_denoiser(getattr(pipe, denoiser), rank=rank, dtype=dtype, keep=keep)
    return pipe, None


def stored_bytes(denoiser: nn.Module) -> dict[str, bytes]:
    """The bytes of every stored weight and scale of `denoiser`'s quantized linears (`BranchedLinear.STORED`: fp8
    values and row scales; int4 packs, group scales and zeros), what must never change (the branches:
    `held_branches`)."""
    return {
        f"{name}.{part}": getattr(module, part).detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        for name, module in denoiser.named_modules()
        if isinstance(module, BranchedLinear)
        for part in module.STORED
    }


def held_branches(denoiser: nn.Module) -> list[str]:
    """The names of `denoiser`'s branched linears whose branch is not all zero (factors, scales or `branch_rank`):
    none once every LoRA is cleared (what the padded formula adds then is exactly zero)."""
    return [
        name
        for name, module in denoiser.named_modules()
        if isinstance(module, BranchedLinear)
        and (module.branch_rank or any(bool(b.any()) for b in (module.lora_down, module.lora_up, module.lora_scales)))
    ]
