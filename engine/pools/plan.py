"""The start-up memory plan: what each pool keeps on the GPU, checked before anything loads and again after.

The device's room for pipelines is its memory less what inference needs free (`MemorySpec.working_bytes`, the
largest of the pools' families) and each pool's `DEVICE_CACHE_BYTES` (prepared adapters). A pool on the device
costs its weights, plus, where its pristine copies live on the device, what they may take: `PRISTINE_BYTES`, or
the weights a LoRA may touch when fewer. The plan takes the first of these that fits: every pool resident with its
pristine copies; every pool resident, pristine copies on the device for those that still fit, in host RAM for the
others (`PRISTINE_STORE=auto`); pools taking turns (`POOL_OFFLOAD=on`: each must fit alone); then the same with
the components a family may run from host RAM left there (`MemorySpec.host_components`: FLUX's T5). A plan that
cannot fit is refused, before loading when the families declare their sizes, with what would fit: which pools,
which settings, which GPU. Where the device has no bound (the CPU, ZeroGPU's per-call GPU) there is no plan.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from engine.errors import SettingsError
from engine.families.registry import family_spec
from engine.families.spec import MemorySpec
from engine.pipeline.loading import LoadedPipeline, resolve_dtype
from engine.pools.flat import module_bytes
from engine.settings import Settings

__all__ = [
    "GPUS",
    "MemoryPlan",
    "Placement",
    "PlanOptions",
    "PoolNeed",
    "declared_needs",
    "device_memory",
    "loaded_need",
    "pipeline_modules",
    "plan_memory",
]

logger = logging.getLogger(__name__)

_GIB = 2**30
# GPUs a Space can run on, with about the memory torch reports for each (rounded down), smallest first.
GPUS: tuple[tuple[str, int], ...] = (
    ("T4 (16 GB)", int(14.5 * _GIB)),
    ("A10G or L4 (24 GB)", int(22.0 * _GIB)),
    ("L40S (48 GB)", int(44.0 * _GIB)),
    ("A100 or H100 (80 GB)", int(79.0 * _GIB)),
)
# The smallest adapter cache worth suggesting.
_MIN_ADAPTER_CACHE = 256 * 2**20


@dataclass(frozen=True)
class PoolNeed:
    """What one pool would hold on the device: all its weights, those a LoRA may touch, and those its family may
    leave in host RAM (by component); and what its inference needs free beside them."""

    name: str
    weights: int
    touchable: int
    host_able: tuple[tuple[str, int], ...] = ()
    working: int = MemorySpec().working_bytes


@dataclass(frozen=True)
class PlanOptions:
    """The settings a plan reads."""

    pristine_bytes: int | None  # None: each pool's touchable weights
    pristine_store: str
    offload: bool
    adapter_cache: int

    @classmethod
    def of(cls, settings: Settings) -> PlanOptions:
        return cls(settings.pristine_bytes, settings.pristine_store, settings.pool_offload, settings.device_cache_bytes)


@dataclass(frozen=True)
class Placement:
    """One pool in a plan: the weights it keeps on the device, what its pristine copies may take there (0: in host
    RAM), and the components left in host RAM."""

    name: str
    weights: int
    pristine: int
    host_components: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.weights + self.pristine

    @property
    def pristine_store(self) -> str:
        return "device" if self.pristine else "cpu"


@dataclass(frozen=True)
class MemoryPlan:
    """A plan that fits: the device's memory, the room for pipelines, each pool's placement, and whether the
    pools all stay resident or take turns."""

    total: int
    room: int
    placements: tuple[Placement, ...]
    resident: bool
    # A smaller PRISTINE_BYTES with which every pool would stay resident with its pristine copies on the device.
    smaller_pristine: int | None = None

    def placement(self, name: str) -> Placement:
        return next(p for p in self.placements if p.name == name)

    def host_components(self, name: str) -> tuple[str, ...]:
        """The components pool `name` must keep (and run) in host RAM: its loading is told so."""
        return self.placement(name).host_components

    def describe(self) -> str:
        pools = "; ".join(
            f"{p.name} {_gib(p.weights)}"
            + (f" + {_gib(p.pristine)} pristine copies" if p.pristine else " (pristine copies in host RAM)")
            + (f", {' and '.join(p.host_components)} in host RAM" if p.host_components else "")
            for p in self.placements
        )
        mode = "all resident" if self.resident else "taking turns (POOL_OFFLOAD)"
        hint = (
            f" (PRISTINE_BYTES={self.smaller_pristine // 2**20}MiB would keep every pool resident with its pristine "
            "copies on the device; a LoRA set touching more weights is then refused)"
            if self.smaller_pristine is not None
            else ""
        )
        return f"{_gib(self.room)} of {_gib(self.total)} for pipelines, {mode}: {pools}{hint}"


def device_memory(device: torch.device, *, per_call: bool) -> int | None:
    """The device's memory where the plan must keep a bound; None on the CPU and on ZeroGPU (lent per call)."""
    if device.type != "cuda" or per_call:
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def pipeline_modules(loaded: LoadedPipeline) -> list[nn.Module]:
    """The pipeline's modules that hold weights and live on the device (what moves between it and host RAM)."""
    return [
        m for c, m in loaded.pipe.components.items() if isinstance(m, nn.Module) and c not in loaded.host_components
    ]


def loaded_need(loaded: LoadedPipeline) -> PoolNeed:
    """A loaded pipeline's need, measured (without the components already left in host RAM)."""
    family, pipe = loaded.family, loaded.pipe
    touchable = module_bytes(getattr(pipe, c) for c in family.components if c not in loaded.host_components)
    movable = [c for c in family.memory.host_components if c not in loaded.host_components]
    host_able = tuple((c, module_bytes([getattr(pipe, c)])) for c in movable)
    weights = module_bytes(pipeline_modules(loaded))
    return PoolNeed(loaded.base_model_id, weights, touchable, host_able, family.memory.working_bytes)


def declared_needs(settings: Settings, device: torch.device) -> tuple[PoolNeed, ...] | None:
    """Each pool's need from its family's declared sizes, before loading; None when a pool's are unknown (a tiny
    pipeline, a local folder, or a family that declares none)."""
    needs = []
    for pool in settings.pool_settings:
        family = family_spec(pool.base_model_id, setting="BASE_MODEL_ID")
        memory = family.memory
        # Each family's own half precision under DTYPE=auto (FLUX.1: bfloat16), as load_pipeline loads it.
        itemsize = torch.empty((), dtype=resolve_dtype(settings.dtype, device, family.half_dtype)).element_size()
        # A local folder may hold anything (a tiny pipeline, a pruned one): it is judged once loaded.
        if settings.for_pool(pool).loads_tiny or Path(pool.model_id).exists() or not memory.values:
            return None
        host_able = tuple((c, memory.values_of((c,)) * itemsize) for c in memory.host_components)
        weights, touchable = memory.total_values * itemsize, memory.values_of(family.components) * itemsize
        needs.append(PoolNeed(pool.base_model_id, weights, touchable, host_able, memory.working_bytes))
    return tuple(needs)


def plan_memory(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> MemoryPlan:
    """The first plan that fits `total` bytes of device memory; SettingsError says what would fit otherwise."""
    plan = _first_fit(needs, total, options)
    if plan is None:
        raise SettingsError(_refusal(needs, total, options))
    ideal = plan.resident and all(p.pristine and not p.host_components for p in plan.placements)
    if ideal or options.pristine_store == "cpu":
        return plan
    return replace(plan, smaller_pristine=_smaller_pristine(needs, total, options))


def _smaller_pristine(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> int | None:
    """The largest PRISTINE_BYTES (in 256 MiB steps, at least 1 GiB) with which every pool stays resident with its
    pristine copies on the device; None when there is none."""
    room = _room(needs, total, options)
    step = 256 * 2**20
    largest = max(n.touchable for n in needs) if options.pristine_bytes is None else options.pristine_bytes
    size = largest - largest % step
    while size >= 2**30:
        if sum(_place(n, size, pristine=True, host=False).nbytes for n in needs) <= room:
            return size
        size -= step
    return None


def _working(needs: Sequence[PoolNeed]) -> int:
    return max(n.working for n in needs)


def _room(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> int:
    return total - _working(needs) - len(needs) * options.adapter_cache


def _first_fit(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> MemoryPlan | None:
    room = _room(needs, total, options)
    for host in (False, True) if any(n.host_able for n in needs) else (False,):
        for placements, resident in _candidates(needs, options, room, host=host):
            if (sum if resident else max)(p.nbytes for p in placements) <= room:
                return MemoryPlan(total, room, placements, resident)
    return None


def _candidates(
    needs: Sequence[PoolNeed], options: PlanOptions, room: int, *, host: bool
) -> Iterator[tuple[tuple[Placement, ...], bool]]:
    """(placements, all resident) in the order the plan prefers them: a resident pool never pays a move, while a
    pristine copy in host RAM costs a copy of only the weights a LoRA touches at each swap."""
    device = tuple(_place(n, options.pristine_bytes, pristine=True, host=host) for n in needs)
    cpu = tuple(_place(n, options.pristine_bytes, pristine=False, host=host) for n in needs)
    store = options.pristine_store
    if store != "cpu":
        yield device, True
    if store == "auto":
        # Pristine copies on the device for the pools that still fit, the default pool first.
        mixed = list(cpu)
        for index, placement in enumerate(device):
            if sum(p.nbytes for p in mixed) - mixed[index].nbytes + placement.nbytes <= room:
                mixed[index] = placement
        yield tuple(mixed), True
    if store == "cpu":
        yield cpu, True
    if options.offload:
        # Taking turns: each pool alone, its pristine copies on the device where it fits with them.
        chosen = {"device": device, "cpu": cpu}.get(store)
        yield chosen or tuple(d if d.nbytes <= room else c for d, c in zip(device, cpu, strict=True)), False


def _allowance(need: PoolNeed, pristine_bytes: int | None) -> int:
    return need.touchable if pristine_bytes is None else min(pristine_bytes, need.touchable)


def _place(need: PoolNeed, pristine_bytes: int | None, *, pristine: bool, host: bool) -> Placement:
    left = need.host_able if host else ()
    weights = need.weights - sum(n for _, n in left)
    allowance = _allowance(need, pristine_bytes) if pristine else 0
    return Placement(need.name, weights, allowance, tuple(c for c, _ in left))


def _refusal(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> str:
    own = ", ".join(
        f"{n.name} {_gib(n.weights)} (its pristine copies up to {_gib(_allowance(n, options.pristine_bytes))})"
        for n in needs
    )
    head = (
        f"the pools do not fit this GPU's {_gib(total)}, of which {_gib(_working(needs))} is kept for inference and "
        f"{_gib(options.adapter_cache)} per pool for adapters (DEVICE_CACHE_BYTES): {own}, with "
        f"POOL_OFFLOAD={'on' if options.offload else 'off'} and PRISTINE_STORE={options.pristine_store}"
    )
    return f"{head}; accepted: {'; or '.join(_would_fit(needs, total, options))}"


def _fits(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> bool:
    return _first_fit(needs, total, options) is not None


def _would_fit(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> list[str]:
    """What would fit instead: fewer pools, other settings here, or a larger GPU."""
    out = []
    kept: list[PoolNeed] = []
    for need in needs:
        if _fits([*kept, need], total, options):
            kept.append(need)
    if kept:
        out.append(f"MODELS with {' and '.join(n.name for n in kept)} only (these fit here)")
    offload = replace(options, offload=True)
    store = replace(options, pristine_store="auto" if options.pristine_store == "device" else options.pristine_store)
    relaxed = replace(store, offload=True)
    changes = {v: c for v, c in (("POOL_OFFLOAD=on", offload), ("PRISTINE_STORE=auto", store)) if c != options}
    # Each change that fits on its own; both together only when neither does.
    said = [v for v, c in changes.items() if _fits(needs, total, c)]
    if not said and len(changes) == 2 and _fits(needs, total, relaxed):
        said.append(" and ".join(changes))
    out.extend(said)
    cache = _largest_cache(needs, total, relaxed)
    if cache is not None and cache < options.adapter_cache and not said:
        out.append(f"DEVICE_CACHE_BYTES={cache // 2**20}MiB" + (f" with {' and '.join(changes)}" if changes else ""))
    larger = next((name for name, size in GPUS if size > total and _fits(needs, size, options)), None)
    out.append(f"a larger GPU: {larger}" if larger is not None else f"a GPU larger than {GPUS[-1][0]}")
    return out


def _largest_cache(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> int | None:
    """The largest DEVICE_CACHE_BYTES, in 256 MiB steps from the current one down, with which the pools fit."""
    cache = options.adapter_cache - options.adapter_cache % _MIN_ADAPTER_CACHE
    while cache >= _MIN_ADAPTER_CACHE:
        if _fits(needs, total, replace(options, adapter_cache=cache)):
            return cache
        cache -= _MIN_ADAPTER_CACHE
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / _GIB:.2f} GiB"
