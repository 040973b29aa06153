"""The weight storage of a pool's denoiser, and what each costs: the one sizing formula the memory plan
(`engine.pools.plan`) and the engine read.

`native`: the pool's dtype, LoRAs fused into the weights (pristine copies restore them). `fp8`: every Linear
weight of the denoiser in float8 e4m3 (1 byte a value) with one float32 scale per output row, computed in bf16;
every other value of the denoiser (biases, norms, embeddings, convolutions) in bf16; and, for each module LoRAs
may target (the family's `MemorySpec.branch_modules`), LoRA branch buffers A (rank x in) and B (out x rank) in
bf16 at `LORA_MAX_RANK`, zero-padded. A quantized denoiser is never written (LoRAs run beside it), so it needs no
pristine copies. `int4`: every Linear weight of the denoiser as 4-bit codes (half a byte a value) with a bf16
scale and a bf16 zero per group of `INT4_GROUP_SIZE` values along its input (`engine.weights.int4`), the rest as
fp8's. `gguf`: a GGUF file's blocks, each quant type at the bytes a block of it takes for the values a block
holds, as the `gguf` package lays them out (`GGML_QUANT_SIZES`: Q8_0 34 bytes a 32 values, 8.5 bits a value; Q4_K
144 a 256, 4.5 bits), planned by the file's own types (`engine.weights.gguf.planned_gguf_types`), the rest as fp8's.
All of them are one formula, `quantized_bytes`: the Linear values stored in blocks of (values, bytes), bytes per
output row, everything else in bf16, the branch buffers. Torch-free: the families declare their denoiser's
`LinearSizes` (engine.families.spec imports no torch); the `gguf` package needs only numpy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "BRANCHED",
    "BRANCH_BYTES",
    "FP8_BYTES",
    "GGUF_PLAIN",
    "GROUP_BYTES",
    "OTHER_BYTES",
    "QUANTIZED_ORDER",
    "SCALE_BYTES",
    "STORAGES",
    "Block",
    "LinearSizes",
    "Storage",
    "bits_per_value",
    "branch_bytes",
    "fp8_bytes",
    "gguf_block",
    "gguf_bytes",
    "int4_block",
    "int4_bytes",
    "linear_sizes",
    "planned_quantize",
    "quantized_bytes",
    "unplanned_storage",
]

Storage = Literal["native", "fp8", "int4", "gguf"]
STORAGES: tuple[Storage, ...] = get_args(Storage)
# The storages whose denoiser is never written: LoRAs run as low-rank branches beside it (engine.weights.branches).
# `gguf`: a GGUF file's blocks (engine.weights.gguf), chosen by its MODELS item, never by the plan.
BRANCHED: tuple[Storage, ...] = ("fp8", "int4", "gguf")
# The storages QUANTIZE=auto may choose, largest first: the order it tries them in.
QUANTIZED_ORDER: tuple[Storage, ...] = ("fp8", "int4")
FP8_BYTES = 1  # a quantized weight's value (e4m3)
# One scale per output row; float32 is what torchao's and quanto's per-row float8 weights keep (bf16 would halve
# it: 6 MiB for FLUX.1's transformer either way, so the plan counts the larger).
SCALE_BYTES = 4
OTHER_BYTES = 2  # the denoiser's values that stay unquantized, in bf16 (the compute dtype)
BRANCH_BYTES = 2  # LoRA branch factors, in bf16
# GGUF tensor types a pool holds as plain values in the compute dtype (diffusers' `load_gguf_checkpoint` reads F32
# and F16 as tensors, cast to the pool's dtype), not as blocks.
GGUF_PLAIN = ("F32", "F16")
GROUP_BYTES = 4  # an int4 group's scale and zero, in bf16 (the compute dtype, as torchao's tinygemm keeps them)


@dataclass(frozen=True)
class LinearSizes:
    """A denoiser's Linears as fp8 storage sees them: the values of their weights (quantized), their output rows
    (one scale each), and the sum of in + out features over those LoRAs may target (each holds rank x (in + out)
    branch values)."""

    values: int
    rows: int
    branch_widths: int


def branch_bytes(linears: LinearSizes, rank: int) -> int:
    """The LoRA branch buffers (A and B, bf16) of every targeted module at `rank`."""
    return rank * linears.branch_widths * BRANCH_BYTES


# (values a block, bytes a block): how a quantized storage lays out its values.
Block = tuple[int, int]


def quantized_bytes(
    values: int, linears: LinearSizes, rank: int, *, stored: Sequence[tuple[int, Block]], row_bytes: int = 0
) -> int:
    """The one formula of a branched storage: a denoiser of `values` values (parameters and buffers) whose Linear
    weights are `stored` as (how many values, in blocks of (values, bytes)), with `row_bytes` per Linear output row,
    every other value in bf16, with its LoRA branch buffers at `rank`."""
    blocks = sum(count * block[1] // block[0] for count, block in stored)
    held = sum(count for count, _ in stored)
    return blocks + linears.rows * row_bytes + (values - held) * OTHER_BYTES + branch_bytes(linears, rank)


def bits_per_value(block: Block) -> float:
    """A block layout's bits per stored value (Q4_K: 4.5; int4 in groups of 128 with bf16 scale and zero: 4.25)."""
    return 8 * block[1] / block[0]


def gguf_block(quant: str) -> Block:
    """GGUF quant type `quant`'s (values, bytes) a block, from the `gguf` package (llama.cpp's layouts); KeyError
    for a name it does not know."""
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]]


def int4_block(group_size: int) -> Block:
    """An int4 group's layout: half a byte a value, and its scale and zero (`GROUP_BYTES`)."""
    return group_size, group_size // 2 + GROUP_BYTES


def fp8_bytes(values: int, linears: LinearSizes, rank: int) -> int:
    """A denoiser of `values` values (parameters and buffers) in fp8 storage, with its LoRA branch buffers at
    `rank`."""
    return quantized_bytes(values, linears, rank, stored=[(linears.values, (1, FP8_BYTES))], row_bytes=SCALE_BYTES)


def gguf_bytes(values: int, linears: LinearSizes, rank: int, quant: str | Mapping[str, int]) -> int:
    """The same denoiser from a GGUF file, with its LoRA branch buffers at `rank`: every Linear in block type
    `quant` (a name the `gguf` package knows: the type a Hub file's name says), or, read from a file's header, the
    values it stores in each type (`{"Q4_K": n, "Q6_K": m, "F32": k}`; `GGUF_PLAIN` types count as the other values,
    in bf16). The scales live in the blocks. Published files keep a few small linears in F16/F32 or a wider type
    (city96's keep the embedders' inputs): by name alone, a file is a little larger than this."""
    if isinstance(quant, str):
        return quantized_bytes(values, linears, rank, stored=[(linears.values, gguf_block(quant))])
    stored = [(count, gguf_block(name)) for name, count in quant.items() if name not in GGUF_PLAIN]
    return quantized_bytes(values, linears, rank, stored=stored)


def int4_bytes(values: int, linears: LinearSizes, rank: int, group_size: int) -> int:
    """A denoiser of `values` values in int4 storage in groups of `group_size`, with its LoRA branch buffers at
    `rank`: half a byte a Linear value, `GROUP_BYTES` a group. Every Linear counts as quantized: one whose width
    the group size does not divide stays in bf16 (FLUX.1's `x_embedder`, 64 wide: 0.4 MiB more), which the
    declared sizes cannot tell; `tests/engine/pools/test_plan_int4.py` bounds the gap on meta-device models."""
    return quantized_bytes(values, linears, rank, stored=[(linears.values, int4_block(group_size))])


def planned_quantize(storage: str) -> str:
    """The QUANTIZE a pool that loaded in `storage` is planned under: `off` for native; else the storage itself
    (`gguf`: the file's blocks, measured as loaded, never written and never chosen by the plan)."""
    return {"native": "off"}.get(storage, storage)


def linear_sizes(linears: Iterable[tuple[str, int, int]], branch_modules: str | None) -> LinearSizes:
    """The sizes of a denoiser's Linears given as `(name, out_features, in_features)`; `branch_modules`: the
    pattern (`re.search`) of the module names LoRAs may target, None for every Linear."""
    pattern = re.compile(branch_modules) if branch_modules is not None else None
    values = rows = widths = 0
    for name, out_features, in_features in linears:
        values += out_features * in_features
        rows += out_features
        if pattern is None or pattern.search(name):
            widths += out_features + in_features
    return LinearSizes(values, rows, widths)


def unplanned_storage(quantize: str) -> Storage:
    """The storage a `QUANTIZE` value (or a MODELS item's) gives a denoiser where no memory plan is made before it
    loads (no bound on the device, or sizes known only once loaded): fp8 (int4) only where it says `fp8` (`int4`).
    `auto` has nothing to fit there, so it loads native; the plan made after loading keeps that storage."""
    return "fp8" if quantize == "fp8" else "int4" if quantize == "int4" else "native"
