"""LyCORIS layers (LoHa, LoKr, LoCon with a Tucker core): their ΔW, and their scale as LyCORIS defines it.

Products as LyCORIS 4.1.3 and PEFT compute them (they agree on layouts). The scale follows the naming: kohya
names take `alpha / dim` (`alpha = dim` when missing or 0; a LoKr with both halves whole has scale 1), PEFT
names take `alpha / r` from the adapter config. Each ΔW is built in float32 and added to the swap's
accumulator, LoHa's Hadamard and LoKr's Kronecker products folded into one `addcmul_` so no weight-sized ΔW is
materialised for them. Sources, line by line: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from engine.errors import IncompatibleLoraError
from engine.formats.layers import TMP1, TMP2, Mapper, Scratch, as_float32

__all__ = [
    "LYCORIS_PARAMS",
    "LohaFactors",
    "LokrFactors",
    "TuckerFactors",
    "lycoris_layer",
    "lycoris_rank",
]

# Largest r² for which LoHa's ΔW is built as one rank-r² product, and the row blocks of the other way, in
# float32 elements (1 MiB per product: both fit a CPU core's L2 or its share of L3). See `LohaFactors.add_to`.
_FACE_SPLITTING_MAX = 16
_BLOCK_ELEMENTS = 1 << 18

LYCORIS_PARAMS = (
    "hada_w1_a",
    "hada_w1_b",
    "hada_w2_a",
    "hada_w2_b",
    "hada_t1",
    "hada_t2",
    "lokr_w1",
    "lokr_w1_a",
    "lokr_w1_b",
    "lokr_w2",
    "lokr_w2_a",
    "lokr_w2_b",
    "lokr_t2",
    "lora_mid.weight",
)


def _tucker(core: torch.Tensor, out_factor: torch.Tensor, in_factor: torch.Tensor) -> torch.Tensor:
    """(out, in, *kernel) from a core (r, r, *kernel), `out_factor` (r, out) and `in_factor` (r, in).

    LyCORIS `rebuild_tucker` (`functional/general.py` 12-14) and PEFT `make_weight_cp`.
    """
    return torch.einsum("i j ..., i p, j r -> p r ...", core, out_factor, in_factor)


def _opt(fn: Mapper, tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else fn(tensor)


@dataclass(frozen=True)
class LohaFactors:
    """LoHa: `ΔW = scaling · (w1a @ w1b) ⊙ (w2a @ w2b)`; with Tucker cores, each half is `_tucker(t, wa, wb)`."""

    target: int
    w1a: torch.Tensor
    w1b: torch.Tensor
    w2a: torch.Tensor
    w2b: torch.Tensor
    t1: torch.Tensor | None
    t2: torch.Tensor | None
    scaling: float
    needs_base: ClassVar[bool] = False

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        extra = () if self.t1 is None or self.t2 is None else (self.t1, self.t2)
        return (self.w1a, self.w1b, self.w2a, self.w2b, *extra)

    def map(self, fn: Mapper) -> LohaFactors:
        return LohaFactors(
            self.target,
            fn(self.w1a),
            fn(self.w1b),
            fn(self.w2a),
            fn(self.w2b),
            _opt(fn, self.t1),
            _opt(fn, self.t2),
            self.scaling,
        )

    def add_to(self, acc: torch.Tensor, alpha: float, scratch: Scratch) -> None:
        device = acc.device
        w1a, w1b, w2a, w2b = (as_float32(t, device) for t in (self.w1a, self.w1b, self.w2a, self.w2b))
        rank = w1b.shape[0]
        value = alpha * self.scaling
        if self.t1 is not None and self.t2 is not None:
            first = _tucker(as_float32(self.t1, device), w1a, w1b).reshape(acc.shape)
            second = _tucker(as_float32(self.t2, device), w2a, w2b).reshape(acc.shape)
            acc.addcmul_(first, second, value=value)
        elif rank * rank <= _FACE_SPLITTING_MAX:
            # (A1 B1) ⊙ (A2 B2) = (A1 • A2)(B1 • B2), rows of A and columns of B multiplied pairwise: one addmm_
            # of rank r², no weight-sized temporaries (measured at 1280x1280 on one CPU core: r = 4 1.5x faster
            # than the blocked products below, r = 8 1.5x slower).
            left = (w1a[:, :, None] * w2a[:, None, :]).reshape(w1a.shape[0], rank * rank)
            right = (w1b[:, None, :] * w2b[None, :, :]).reshape(rank * rank, w1b.shape[1])
            acc.addmm_(left, right, alpha=value)
        else:
            # Two products and their Hadamard product, a block of rows at a time on the CPU so both products stay
            # in cache, a block per thread (measured at 1280x1280 and 1280x2048, ranks 8-32, one core: about twice
            # as fast as whole weight-sized products; on a GPU one block is the whole weight).
            columns = acc.shape[1]
            block = (
                acc.shape[0] if device.type != "cpu" else max(1, _BLOCK_ELEMENTS * torch.get_num_threads() // columns)
            )
            first_buffer = scratch.get(TMP1, (min(block, acc.shape[0]), columns), device)
            second_buffer = scratch.get(TMP2, (min(block, acc.shape[0]), columns), device)
            for start in range(0, acc.shape[0], block):
                stop = min(start + block, acc.shape[0])
                first = torch.mm(w1a[start:stop], w1b, out=first_buffer[: stop - start])
                second = torch.mm(w2a[start:stop], w2b, out=second_buffer[: stop - start])
                acc[start:stop].addcmul_(first, second, value=value)


@dataclass(frozen=True)
class LokrFactors:
    """LoKr: `ΔW = scaling · kron(w1, w2)`; each half stored whole or as two factors (w2 also with a Tucker core)."""

    target: int
    w1: torch.Tensor | None
    w1a: torch.Tensor | None
    w1b: torch.Tensor | None
    w2: torch.Tensor | None
    w2a: torch.Tensor | None
    w2b: torch.Tensor | None
    t2: torch.Tensor | None
    scaling: float
    needs_base: ClassVar[bool] = False

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        parts = (self.w1, self.w1a, self.w1b, self.w2, self.w2a, self.w2b, self.t2)
        return tuple(t for t in parts if t is not None)

    def map(self, fn: Mapper) -> LokrFactors:
        w1, w1a, w1b, w2, w2a, w2b, t2 = (
            _opt(fn, t) for t in (self.w1, self.w1a, self.w1b, self.w2, self.w2a, self.w2b, self.t2)
        )
        return LokrFactors(self.target, w1, w1a, w1b, w2, w2a, w2b, t2, self.scaling)

    def halves(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`w1` (a, c) and `w2` (b, d · kernel); ΔW viewed as (a, b, c, d · kernel) is their outer product."""

        def f(tensor: torch.Tensor | None) -> torch.Tensor:
            assert tensor is not None  # the constructor in `lycoris_layer` checked which parts exist
            return as_float32(tensor, device)

        w1 = f(self.w1) if self.w1 is not None else f(self.w1a) @ f(self.w1b)
        if self.w2 is not None:
            w2 = f(self.w2)
        elif self.t2 is not None:
            w2 = _tucker(f(self.t2), f(self.w2a), f(self.w2b))
        else:
            w2b = f(self.w2b)
            w2 = f(self.w2a) @ w2b.reshape(w2b.shape[0], -1)
        return w1, w2.reshape(w2.shape[0], -1)

    def add_to(self, acc: torch.Tensor, alpha: float, scratch: Scratch) -> None:
        w1, w2 = self.halves(acc.device)
        (a, c), (b, rest) = w1.shape, w2.shape
        # kron(w1, w2)[i·b + p, j·rest + q] = w1[i, j] · w2[p, q]: a broadcast product, no ΔW in memory.
        acc.view(a, b, c, rest).addcmul_(w1.view(a, 1, c, 1), w2.view(1, b, 1, rest), value=alpha * self.scaling)


@dataclass(frozen=True)
class TuckerFactors:
    """LoCon with a Tucker core (`lora_mid`): `ΔW = scaling · _tucker(mid, upᵀ, down)` for a convolution."""

    target: int
    down: torch.Tensor
    mid: torch.Tensor
    up: torch.Tensor
    scaling: float
    needs_base: ClassVar[bool] = False

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.down, self.mid, self.up)

    def map(self, fn: Mapper) -> TuckerFactors:
        return TuckerFactors(self.target, fn(self.down), fn(self.mid), fn(self.up), self.scaling)

    def add_to(self, acc: torch.Tensor, alpha: float, scratch: Scratch) -> None:
        device = acc.device
        rank = self.mid.shape[0]
        up = as_float32(self.up, device).reshape(-1, rank).t()
        down = as_float32(self.down, device).reshape(rank, -1)
        delta = _tucker(as_float32(self.mid, device), up, down)
        acc.add_(delta.reshape(acc.shape), alpha=alpha * self.scaling)


LycorisLayer = LohaFactors | LokrFactors | TuckerFactors
Pair = tuple[torch.Tensor | None, torch.Tensor | None]


def lycoris_rank(params: Mapping[str, torch.Tensor]) -> int | None:
    """The factorisation rank LyCORIS divides alpha by (None for a LoKr block with both halves whole)."""
    for name in ("hada_w1_b", "lokr_w1_b", "lokr_w2_b", "lora_down.weight"):
        if name in params:
            return int(params[name].shape[0])
    return None


def lycoris_layer(
    target: int,
    params: Mapping[str, torch.Tensor],
    weight_shape: tuple[int, ...],
    *,
    alpha: float | None,
    rank: float | None,
    peft: bool,
    where: str,
) -> LycorisLayer:
    """One module's LyCORIS tensors as a layer update whose ΔW has `weight_shape`, scaled by its naming's rule.

    `alpha` is the alpha the file or its config gives (None when neither does); `rank` overrides the
    rank read from the shapes (PEFT's `r`, for PEFT names). `where` names the module in errors.
    """
    dim = lycoris_rank(params)
    both_whole = "lokr_w1" in params and "lokr_w2" in params
    if peft:
        r = rank if rank is not None else dim
        scaling = 1.0 if r is None or alpha is None else alpha / r
    elif both_whole:
        scaling = 1.0  # LyCORIS lokr.py 210-212
    else:
        assert dim is not None
        scaling = (alpha if alpha else dim) / dim  # LyCORIS: alpha None or 0 means alpha = dim
    layer = _build(target, params, scaling, where)
    _check_shape(layer, weight_shape, where)
    return layer


def _build(target: int, p: Mapping[str, torch.Tensor], scaling: float, where: str) -> LycorisLayer:
    def need(*names: str) -> list[torch.Tensor]:
        missing = [n for n in names if n not in p]
        if missing:
            raise IncompatibleLoraError(f"{where} lacks {', '.join(missing)} (it has {', '.join(sorted(p))})")
        return [p[n] for n in names]

    if any(name.startswith("hada_") for name in p):
        w1a, w1b, w2a, w2b = need("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")
        t1, t2 = p.get("hada_t1"), p.get("hada_t2")
        if (t1 is None) != (t2 is None):
            raise IncompatibleLoraError(f"{where} has one Tucker core of two (hada_t1 and hada_t2 go together)")
        if t1 is None:
            w1a, w2a = w1a.reshape(w1a.shape[0], -1), w2a.reshape(w2a.shape[0], -1)
            w1b, w2b = w1b.reshape(w1b.shape[0], -1), w2b.reshape(w2b.shape[0], -1)
        return LohaFactors(target, w1a, w1b, w2a, w2b, t1, t2, scaling)
    if any(name.startswith("lokr_") for name in p):
        whole1, whole2 = p.get("lokr_w1"), p.get("lokr_w2")
        first: Pair = (None, None) if whole1 is not None else (need("lokr_w1_a")[0], need("lokr_w1_b")[0])
        second: Pair = (None, None) if whole2 is not None else (need("lokr_w2_a")[0], need("lokr_w2_b")[0])
        core = p.get("lokr_t2") if whole2 is None else None
        return LokrFactors(target, whole1, first[0], first[1], whole2, second[0], second[1], core, scaling)
    down, mid, up = need("lora_down.weight", "lora_mid.weight", "lora_up.weight")
    return TuckerFactors(target, down, mid, up, scaling)


def _check_shape(layer: LycorisLayer, weight_shape: tuple[int, ...], where: str) -> None:
    """Refuse factors whose ΔW would not have the weight's shape, from their shapes alone (nothing computed)."""
    out_ch, flat = weight_shape[0], int(torch.Size(weight_shape[1:]).numel())
    kernel = tuple(weight_shape[2:])
    shapes = {name: tuple(t.shape) for name, t in _named(layer).items()}
    if isinstance(layer, LohaFactors):
        if layer.t1 is None:
            r = shapes["w1b"][0]
            fits = all(shapes[f"w{i}a"] == (out_ch, r) and shapes[f"w{i}b"] == (r, flat) for i in (1, 2))
        else:
            r = shapes["w1a"][0]
            fits = all(
                shapes[f"w{i}a"] == (r, out_ch)
                and shapes[f"w{i}b"] == (r, weight_shape[1])
                and shapes[f"t{i}"] == (r, r, *kernel)
                for i in (1, 2)
            )
    elif isinstance(layer, LokrFactors):
        fits = _lokr_fits(layer, shapes, out_ch, flat, kernel)
    else:
        r = shapes["mid"][0]
        fits = (
            shapes["down"][:2] == (r, weight_shape[1])
            and shapes["up"][:2] == (out_ch, r)
            and shapes["mid"] == (r, r, *kernel)
        )
    if not fits:
        described = ", ".join(f"{n} {s}" for n, s in shapes.items())
        raise IncompatibleLoraError(f"{where}: {described} do not fit a weight of shape {weight_shape}")


def _lokr_fits(
    layer: LokrFactors, shapes: Mapping[str, tuple[int, ...]], out_ch: int, flat: int, kernel: tuple[int, ...]
) -> bool:
    if layer.w1 is not None:
        w1 = shapes["w1"]
    elif shapes["w1a"][1] == shapes["w1b"][0]:
        w1 = (shapes["w1a"][0], shapes["w1b"][1])
    else:
        return False
    if len(w1) != 2:
        return False
    if layer.w2 is not None:
        b, rest = shapes["w2"][0], int(torch.Size(shapes["w2"][1:]).numel())
    elif layer.t2 is not None:
        t2, w2a, w2b = shapes["t2"], shapes["w2a"], shapes["w2b"]
        if t2[2:] != kernel or t2[:2] != (w2a[0], w2b[0]) or len(w2a) != 2 or len(w2b) != 2:
            return False
        b, rest = w2a[1], w2b[1] * int(torch.Size(kernel).numel())
    elif shapes["w2a"][1] == shapes["w2b"][0]:
        b, rest = shapes["w2a"][0], int(torch.Size(shapes["w2b"][1:]).numel())
    else:
        return False
    return w1[0] * b == out_ch and w1[1] * rest == flat


def _named(layer: LycorisLayer) -> dict[str, torch.Tensor]:
    fields = {
        LohaFactors: ("w1a", "w1b", "w2a", "w2b", "t1", "t2"),
        LokrFactors: ("w1", "w1a", "w1b", "w2", "w2a", "w2b", "t2"),
        TuckerFactors: ("down", "mid", "up"),
    }[type(layer)]
    return {name: value for name in fields if (value := getattr(layer, name)) is not None}
