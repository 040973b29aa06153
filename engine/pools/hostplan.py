"""The memory plan's host side: what a plan places in host RAM, fitted within `HOST_RAM_BYTES`.

A pool places in host RAM: its components left there (FLUX's T5), its pinned flat buffer when the pools take
turns (every pool may have been moved out once, and keeps that buffer), its adapters' host cache
(`HOST_CACHE_BYTES`) and, where the plan keeps them there, its pristine copies: `PRISTINE_BYTES` when set; under
`auto` each such pool's touchable weights, or a share of what is left in proportion to them (at least 1 GiB, or
the pool's touchable weights when fewer). Pinned bytes are counted as pinned (`engine.hostmem.pinned_nbytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.hostmem import pinned_nbytes
from engine.pools.placement import gib

if TYPE_CHECKING:
    from engine.pools.needs import PoolNeed
    from engine.pools.placement import Placement, PlanOptions

__all__ = ["MIN_CACHE", "HostNeed", "fit_host", "host_need", "host_refusal", "pristine_budget"]

# The least a pool's pristine copies get in host RAM under `PRISTINE_BYTES=auto` (its touchable weights if fewer).
_MIN_PRISTINE = 2**30
_STEP = 2**20
# The smallest adapter cache (host or device) worth suggesting, and the step of a suggestion.
MIN_CACHE = 256 * 2**20


@dataclass(frozen=True)
class HostNeed:
    """What one placed pool holds in host RAM, by kind."""

    name: str
    components: int
    parked: int
    adapters: int
    pristine: int

    @property
    def nbytes(self) -> int:
        return self.components + self.parked + self.adapters + self.pristine


def host_need(
    need: PoolNeed, placement: Placement, *, resident: bool, options: PlanOptions, pristine: int | None = None
) -> HostNeed:
    """What `placement` holds in host RAM with `pristine` bytes for its pristine copies there (None: what the
    settings ask, at least the share's minimum under `auto`)."""
    components = sum(n for c, n in need.host_able if c in placement.host_components)
    parked = 0 if resident else pinned_nbytes(placement.weights)
    if pristine is None:
        pristine = _wanted(need, placement, options)
        if options.pristine_bytes is None:
            pristine = min(pristine, _MIN_PRISTINE)
    return HostNeed(need.name, components, parked, options.host_cache, pristine)


def fit_host(
    needs: Sequence[PoolNeed], placements: Sequence[Placement], *, resident: bool, options: PlanOptions
) -> tuple[Placement, ...] | None:
    """`placements` with their host RAM and pristine budget there set, or None when they do not fit it."""
    wanted = [_wanted(n, p, options) for n, p in zip(needs, placements, strict=True)]
    fixed = [
        host_need(n, p, resident=resident, options=options, pristine=0).nbytes
        for n, p in zip(needs, placements, strict=True)
    ]
    granted = wanted
    if options.host_ram is not None:
        left = options.host_ram - sum(fixed)
        if options.pristine_bytes is not None:
            left -= sum(wanted)
        if left < 0:  # (also where no pool wants copies there: quantized pools with nothing else touchable)
            return None
        if options.pristine_bytes is None and sum(wanted) > left:
            granted = [w * left // sum(wanted) // _STEP * _STEP for w in wanted]
            if any(g < min(w, _MIN_PRISTINE) for g, w in zip(granted, wanted, strict=True)):
                return None
    return tuple(
        replace(p, host_pristine=g, host_bytes=f + g) for p, f, g in zip(placements, fixed, granted, strict=True)
    )


def pristine_budget(
    sizes: Sequence[int], *, pinned: bool, pristine_bytes: int | None, host_pristine: int | None
) -> tuple[int, str]:
    """A pool's pristine-copy budget and the setting its refusal names, for weights of `sizes` bytes.

    `PRISTINE_BYTES=auto` holds every touchable weight's copy, pinned ones at what pinning them takes (so no LoRA
    is refused for its coverage); `host_pristine`, what the plan left in host RAM, binds when it is less than
    the touchable weights (their rounding is the host margin's).
    """
    touchable = sum(sizes)
    held = sum(pinned_nbytes(n) for n in sizes) if pinned else touchable
    budget = held if pristine_bytes is None else pristine_bytes
    if host_pristine is not None and host_pristine < min(budget, touchable):
        return host_pristine, "HOST_RAM_BYTES"
    return budget, "PRISTINE_BYTES"


def _wanted(need: PoolNeed, placement: Placement, options: PlanOptions) -> int:
    """Pristine bytes the settings ask for in host RAM (0 where the copies live on the device)."""
    if placement.pristine:
        return 0
    return need.touchable if options.pristine_bytes is None else min(options.pristine_bytes, need.touchable)


def host_refusal(
    needs: Sequence[PoolNeed],
    held: Sequence[HostNeed],
    options: PlanOptions,
    *,
    fits: Callable[[Sequence[PoolNeed], PlanOptions], bool],
) -> str:
    """The pools fit the GPU but not HOST_RAM_BYTES: what each would hold there (`held`), and what would fit
    (`fits(needs, options)`: a plan fits the GPU and the host)."""
    kinds = ("components", "pinned weights while it waits", "HOST_CACHE_BYTES", "pristine copies at least")
    own = "; ".join(
        f"{h.name} {gib(h.nbytes)} ("
        + ", ".join(
            f"{kind} {gib(n)}"
            for kind, n in zip(kinds, (h.components, h.parked, h.adapters, h.pristine), strict=True)
            if n
        )
        + ")"
        for h in held
    )
    need = sum(h.nbytes for h in held)
    accepted = [f"HOST_RAM_BYTES of at least {need // 2**20}MiB (a machine with more RAM)"]
    cache = options.host_cache - options.host_cache % MIN_CACHE
    while cache >= MIN_CACHE and not fits(needs, replace(options, host_cache=cache)):
        cache -= MIN_CACHE
    if MIN_CACHE <= cache < options.host_cache:
        accepted.append(f"HOST_CACHE_BYTES={cache // 2**20}MiB")
    kept: list[PoolNeed] = []
    for one in needs:
        if fits([*kept, one], options):
            kept.append(one)
    if kept and len(kept) < len(needs):
        accepted.append(f"MODELS with {' and '.join(n.name for n in kept)} only (these fit here)")
    return (
        f"what the pools place in host RAM does not fit HOST_RAM_BYTES ({gib(options.host_ram or 0)}): {own}; "
        f"accepted: {'; or '.join(accepted)}"
    )
