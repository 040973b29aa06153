"""How far a layer update can move its weight's values, bounded once from its factors at preparation.

Reading every fused weight back after each swap costs a pass over the touched weights (and a device sync on a
GPU), so each layer's largest possible |ΔW| is bounded here, on the host, when the adapter is prepared, and the
swap checks a weight only when `max|W| + Σ |scale| · bound` could reach the dtype's largest finite value
(`fused_bound`, `needs_check`): for realistic LoRAs in bfloat16 or float32, never. The bounds are triangle
inequalities on the formats' products; `peak` also covers every float32 intermediate.
Why they are sound: docs/internals.md, "engine/formats/bounds.py".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from engine.formats.dora import DoraUpdate
from engine.formats.layers import LayerDelta, LayerFactors, LayerUpdate
from engine.formats.lycoris import LohaFactors, LokrFactors, TuckerFactors

__all__ = ["UNBOUNDED", "Reach", "fused_bound", "needs_check", "reach"]

# A DoRA row is rescaled to its magnitude: |W'| <= |m| unless the row's float32 norm underflowed (every value
# below 2^-60), when the clamped norm (2^-126) can scale it by up to 2^66. Its factor m / norm is finite while
# |m| < 4 (= 2^128 · 2^-126); 2 leaves the margin below.
_DORA_GROWTH = 2.0**66
_DORA_MAGNITUDE_LIMIT = 2.0
# Half the largest finite value: covers float32 rounding of the sums and factors cast to a narrower dtype
# (each value moves by a relative 2^-8 at most in bfloat16, 2^-4 in float8; at most four factors multiply).
_MARGIN = 0.5


@dataclass(frozen=True)
class Reach:
    """Bounds on one layer update, from its factors alone.

    `delta`: ≥ max|ΔW| at request scale 1, the layer's own scaling included. `peak`: ≥ |every float32 value
    formed while computing ΔW| before the request's scale and the layer's `scaling` multiply it. `magnitude`:
    DoRA's max|m| (its result is rescaled to it; `delta` and `peak` are then its LoRA part's).
    """

    delta: float
    peak: float
    scaling: float
    magnitude: float | None = None


UNBOUNDED = Reach(math.inf, math.inf, math.inf)


def reach(layer: LayerUpdate) -> Reach:
    """The bounds of `layer` (its tensors on the host: this reads them); `UNBOUNDED` for a kind it does not know."""
    with torch.no_grad():
        if isinstance(layer, DoraUpdate):
            return replace(reach(layer.inner), magnitude=_max_abs(layer.magnitude))
        scaling = abs(getattr(layer, "scaling", math.nan))
        if isinstance(layer, LayerFactors):
            product = _product(layer.up, layer.down)
            # BLAS may scale a factor before the product: the factors' own values are formed too.
            return Reach(scaling * product, max(product, _max_abs(layer.up), _max_abs(layer.down)), scaling)
        if isinstance(layer, LayerDelta):
            largest = _max_abs(layer.delta)
            return Reach(scaling * largest, largest, scaling)
        if isinstance(layer, LohaFactors):
            if layer.t1 is not None and layer.t2 is not None:
                first, second = _tucker(layer.t1, layer.w1a, layer.w1b), _tucker(layer.t2, layer.w2a, layer.w2b)
            else:
                first, second = _product(layer.w1a, layer.w1b), _product(layer.w2a, layer.w2b)
            return _linear(layer, first * second, scaling)
        if isinstance(layer, LokrFactors):
            return _linear(layer, _lokr_w1(layer) * _lokr_w2(layer), scaling)
        if isinstance(layer, TuckerFactors):
            rank = layer.mid.shape[0]
            product = _tucker(layer.mid, layer.up.reshape(-1, rank).t(), layer.down.reshape(rank, -1))
            return _linear(layer, product, scaling)
    return UNBOUNDED


def fused_bound(base_max: float, updates: Iterable[tuple[Reach, float]]) -> float:
    """≥ |every value the fuse writes| into a weight whose pristine values reach `base_max`, given (reach, scale)
    for each update on it: the float32 accumulator, each update's own products, and the result (not DoRA's
    norms: an infinite norm scales its row to 0, a finite value)."""
    total, formed = base_max, base_max
    for bound, scale in updates:
        formed = max(formed, max(1.0, abs(scale) * bound.scaling) * bound.peak)
        if bound.magnitude is None:
            total += abs(scale) * bound.delta
            continue
        if not bound.magnitude < _DORA_MAGNITUDE_LIMIT:
            return math.inf  # m / norm may overflow on a row whose norm is tiny
        # W0 + scale·ΔW is formed before the rescale; the rescaled result replaces W0 (or adds W' - W0).
        formed = max(formed, base_max + abs(scale) * bound.delta)
        total += bound.magnitude * _DORA_GROWTH + base_max
    return max(total, formed)


def needs_check(base_max: float, updates: Iterable[tuple[Reach, float]], dtype: torch.dtype) -> bool:
    """Whether fusing `updates` into a weight of `dtype` could leave a value that is not finite."""
    limit = min(torch.finfo(dtype).max, torch.finfo(torch.float32).max) * _MARGIN
    return not fused_bound(base_max, updates) < limit  # NaN (a non-finite base) checks too


def _max_abs(tensor: torch.Tensor) -> float:
    if not tensor.numel():
        return 0.0
    low, high = torch.aminmax(tensor.float())
    return max(abs(float(low)), abs(float(high)))


def _product(left: torch.Tensor, right: torch.Tensor) -> float:
    """≥ |every entry and partial sum of `left @ right`|: max_i Σ_k |left_ik| · max_j |right_kj|."""
    left, right = left.float().reshape(left.shape[0], -1), right.float().reshape(right.shape[0], -1)
    return float((left.abs() @ right.abs().amax(dim=1)).max())


def _tucker(core: torch.Tensor, out_factor: torch.Tensor, in_factor: torch.Tensor) -> float:
    """≥ max|`engine.formats.lycoris._tucker(core, out_factor, in_factor)`|: Σ_ij |core_ij| max|out_i| max|in_j|."""
    out_max = out_factor.float().reshape(out_factor.shape[0], -1).abs().amax(dim=1)
    in_max = in_factor.float().reshape(in_factor.shape[0], -1).abs().amax(dim=1)
    return float(torch.einsum("ij...,i,j->...", core.float().abs(), out_max, in_max).max())


def _lokr_w1(layer: LokrFactors) -> float:
    if layer.w1 is not None:
        return _max_abs(layer.w1)
    assert layer.w1a is not None and layer.w1b is not None  # `lycoris_layer` checked which parts exist
    return _product(layer.w1a, layer.w1b)


def _lokr_w2(layer: LokrFactors) -> float:
    if layer.w2 is not None:
        return _max_abs(layer.w2)
    assert layer.w2a is not None and layer.w2b is not None
    if layer.t2 is not None:
        return _tucker(layer.t2, layer.w2a, layer.w2b)
    return _product(layer.w2a, layer.w2b)


def _linear(layer: LayerUpdate, product: float, scaling: float) -> Reach:
    """A LyCORIS kind: ΔW ≤ `product`; every intermediate is a sum of at most (Σ numel)² terms, each a product
    of at most one value of each factor (its contractions run over ranks, each below a factor's size)."""
    terms = float(sum(t.numel() for t in layer.tensors))
    values = math.prod(max(1.0, _max_abs(t)) for t in layer.tensors)
    return Reach(scaling * product, max(product, terms * terms * values), scaling)
