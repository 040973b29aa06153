"""A quantized pool's swap: the denoiser's LoRAs as low-rank branches, the text encoders' fused as everywhere else.

On a pool whose denoiser is stored in fp8 (`engine.weights.quantized`), fusing a LoRA into the stored weight would
keep mostly rounding noise of it (`bench.fp8`), so each adapted linear adds `Σ scaleᵢ · Bᵢ(Aᵢ(x))` beside its
weight instead. A swap copies the set's factors into the branch buffers, packed along the rank (the set's LoRAs
share the `LORA_MAX_RANK` ranks each buffer holds) and sets the per-rank scales; it never writes the stored
weights, so they stay as loaded after any sequence of swaps and failures. The text encoders stay in the pool's
dtype and take the exact fused swap (`WeightPatcher`).

What a branch cannot hold is refused before anything changes, with a 4xx: a LoRA (or a set) over the branch rank,
LoHa/LoKr/DoRA layers on the denoiser (their ΔW is not of rank r: as a dense ΔW branch each would cost a bf16
weight, more than the fp8 weight it sits beside), a full difference of a stored linear's weight (the same: a
dense ΔW), and modules of the denoiser with no branch (its convolutions). A stored component's other parameters
(biases, norms, modulation tables: `engine.formats.differences`) stay in the compute dtype and take the fused swap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from engine.errors import IncompatibleLoraError, LimitExceededError, UnsupportedLoraVariantError
from engine.formats.adapters import PreparedAdapter
from engine.formats.differences import FullDifference
from engine.formats.layers import LayerFactors, LayerUpdate
from engine.formats.targets import TargetTable
from engine.weights.quantized import BranchedLinear
from engine.weights.swap import ActiveAdapter, WeightPatcher

__all__ = ["BranchedPatcher", "Branches"]

Parts = dict[int, list[tuple[torch.Tensor, torch.Tensor, float]]]
RANK_SETTING = "LORA_MAX_RANK"


class Branches:
    """The branched linears of one pool's stored components, by `TargetTable` index, and which of them hold factors
    now: the denoiser's, and `more` (a two-stage pool's second transformer, by component name). `second`: the
    second stage's weight indices, where an adapter's `scale_2` applies (`ActiveAdapter.scale_at`)."""

    def __init__(
        self,
        table: TargetTable,
        denoiser: torch.nn.Module,
        *,
        more: Mapping[str, torch.nn.Module] | None = None,
        second: frozenset[int] = frozenset(),
    ) -> None:
        components = {table.denoiser: denoiser, **(more or {})}
        self._names = table.names
        self._second = second
        self._denoiser: set[int] = set()
        self._modules: dict[int, BranchedLinear] = {}
        for component, module in components.items():
            prefix = f"{component}."
            # Its Linear/Conv2d weights only: a bias, norm or modulation table (a full difference's target) stays
            # in the compute dtype beside the quantized weights, the fused swap's, as the encoders' weights.
            owned = [i for i, n in enumerate(table.names) if n.startswith(prefix) and table.module_weight(i)]
            self._denoiser.update(owned)
            for index in owned:
                linear = module.get_submodule(table.names[index].removeprefix(prefix))
                if isinstance(linear, BranchedLinear):
                    self._modules[index] = linear
        self._held: set[int] = set()
        self._factors: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._held)

    def owns(self, index: int) -> bool:
        """Whether weight `index` is a stored component's (a branch, or refused): never the fused swap's."""
        return index in self._denoiser

    def plan(self, active: Sequence[ActiveAdapter]) -> Parts:
        """Each branched linear's (down, up, scale) for this set, checked to fit; raises a 4xx, changing nothing."""
        parts: Parts = {}
        for item in active:
            layers = [layer for layer in item.adapter.layers if self.owns(layer.target)]
            self._check_kinds(item, layers)
            for layer in layers:
                assert isinstance(layer, LayerFactors)  # _check_kinds refused every other kind
                # `scale` on the first stage, `scale_2` (where given) on the second's branches.
                scale = item.scale_at(layer.target, self._second)
                parts.setdefault(layer.target, []).append((layer.down, layer.up, scale * layer.scaling))
        for index, factors in parts.items():
            rank, limit = sum(down.shape[0] for down, _, _ in factors), self._modules[index].rank
            if rank > limit:
                raise _over_rank(active, self._names[index], rank, limit)
        return parts

    def _check_kinds(self, item: ActiveAdapter, layers: Sequence[LayerUpdate]) -> None:
        label = f"LoRA {item.adapter.key.name!r}"
        full = sorted({self._names[x.target] for x in layers if isinstance(x, FullDifference)})
        if full:
            raise UnsupportedLoraVariantError(
                f"{label} has full differences of linear weights ({', '.join(full[:4])}"
                f"{f' and {len(full) - 4} more' if len(full) > 4 else ''}), which a quantized pool (QUANTIZE, GGUF) "
                "cannot add beside its stored weights; accepted there: plain LoRA and LoCon factors, and full "
                "differences of biases, norms and modulation (of linear weights too on a pool served in its own dtype)"
            )
        other = sorted({type(layer).__name__ for layer in layers if not isinstance(layer, LayerFactors)})
        if other:
            raise UnsupportedLoraVariantError(
                f"{label} is a LoHa, LoKr or DoRA on the denoiser (its layers there: {', '.join(other)}), whose ΔW "
                "a quantized pool (QUANTIZE) cannot add as a low-rank branch beside its fp8 weights; accepted "
                "there: plain LoRA and LoCon (LoHa, LoKr and DoRA on a pool served in its own dtype)"
            )
        missing = sorted({self._names[x.target] for x in layers if x.target not in self._modules})
        if missing:
            raise IncompatibleLoraError(
                f"{label} adapts {', '.join(missing[:5])}, which have no low-rank branch on this quantized pool; "
                "accepted there: LoRAs adapting the denoiser's linear layers"
            )

    def apply(self, parts: Parts) -> None:
        """Hold exactly `parts` (from `plan`): branches that held factors and get none are zeroed. Every branch
        about to be written counts as held first, so that a failure half-way leaves `clear` all it must zero.
        The same factors at other scales (a schedule's step boundary) change the branches' scales only."""
        if parts and parts.keys() == self._held and all(_same(parts[i], self._factors.get(i, [])) for i in parts):
            for index, factors in parts.items():
                self._modules[index].load_scales(factors)
            return
        self._factors = {}
        self._held |= parts.keys()
        for index in sorted(self._held):
            self._modules[index].load_branch(parts.get(index, []))
        self._held = set(parts)
        # The factors held, by reference: `_same` tells the same tensors (an adapter's device copy), not equal ones.
        self._factors = {index: [(down, up) for down, up, _ in factors] for index, factors in parts.items()}

    def rescale(self, parts: Parts, indices: Iterable[int]) -> None:
        """A step boundary: the branches `indices` take `parts`' scales, every other branch stays as it is, where
        `parts` hold the very factors held now; otherwise the whole `apply`."""
        if parts.keys() != self._held or not all(_same(parts[i], self._factors.get(i, [])) for i in parts):
            self.apply(parts)
            return
        for index in sorted(set(indices) & self._held):
            self._modules[index].load_scales(parts[index])

    def clear(self) -> None:
        self.apply({})


def _same(parts: list[tuple[torch.Tensor, torch.Tensor, float]], held: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether `parts` are the very factors `held`, in order (their scales aside)."""
    return len(parts) == len(held) and all(d is d2 and u is u2 for (d, u, _), (d2, u2) in zip(parts, held, strict=True))


def _over_rank(active: Sequence[ActiveAdapter], module: str, rank: int, limit: int) -> LimitExceededError:
    ranks = ", ".join(f"{a.adapter.key.name!r} rank {a.adapter.max_rank}" for a in active)
    together = "" if len(active) == 1 else " together"
    return LimitExceededError(
        f"the LoRA set [{ranks}] needs rank {rank}{together} at {module}, more than the {limit} a quantized pool's "
        f"branches hold ({RANK_SETTING}={limit}); accepted: LoRAs whose ranks sum to at most {limit}"
    )


class BranchedPatcher:
    """`WeightPatcher`'s part in `FusedSet` for a quantized pool: the denoiser's layers go to `Branches`, the
    others (text encoders) to the fused `WeightPatcher`. Checks first, so a refused set changes nothing; any later
    failure leaves both at the base for the caller's rollback."""

    def __init__(self, fused: WeightPatcher, branches: Branches) -> None:
        self._fused = fused
        self._branches = branches

    @property
    def dirty(self) -> frozenset[int]:
        return self._fused.dirty | self._branches.held

    @property
    def pristine_bytes(self) -> int:
        return self._fused.pristine_bytes

    @property
    def budget(self) -> int | None:
        return self._fused.budget

    @torch.no_grad()
    def apply(self, active: Sequence[ActiveAdapter]) -> None:
        parts = self._branches.plan(active)
        rest = [dataclasses.replace(a, adapter=_without(a.adapter, self._branches.owns)) for a in active]
        try:
            self._fused.apply([a for a in rest if a.adapter.layers])
            self._branches.apply(parts)
        except BaseException:
            self.restore_all()
            raise

    @property
    def second(self) -> frozenset[int]:
        return self._fused.second

    @torch.no_grad()
    def rewrite(self, active: Sequence[ActiveAdapter], indices: Iterable[int]) -> None:
        """A step boundary (`WeightPatcher.rewrite`): only weights `indices` change, the branches' by their scales."""
        wanted = set(indices)
        fused = {i for i in wanted if not self._branches.owns(i)}
        parts = self._branches.plan(active)
        rest = [dataclasses.replace(a, adapter=_without(a.adapter, self._branches.owns)) for a in active]
        try:
            self._fused.rewrite([a for a in rest if a.adapter.layers], fused)
            self._branches.rescale(parts, {i for i in wanted if self._branches.owns(i)})
        except BaseException:
            self.restore_all()
            raise

    def restore_all(self) -> None:
        self._fused.restore_all()
        self._branches.clear()

    def forget_pristine(self) -> None:
        self._fused.forget_pristine()

    def pristine_copies(self, indices: Sequence[int]) -> Mapping[int, torch.Tensor]:
        return self._fused.pristine_copies(indices)


def _without(adapter: PreparedAdapter, owned: Callable[[int], bool]) -> PreparedAdapter:
    """`adapter` with only the layers the fused swap applies (those of weights `owned` leaves out)."""
    keep = [i for i, layer in enumerate(adapter.layers) if not owned(layer.target)]
    reach = tuple(adapter.reach[i] for i in keep) if len(adapter.reach) == len(adapter.layers) else ()
    return dataclasses.replace(adapter, layers=tuple(adapter.layers[i] for i in keep), reach=reach)
