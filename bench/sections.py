"""The measured sections of the swap benchmark: ours against the floor, then the diffusers ways."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import psutil
import torch
from torch import nn

from engine.formats.adapters import PreparedAdapter
from engine.weights.swap import ActiveAdapter, WeightPatcher
from lora_catalog.entries import Family

from .flux_slice import reference_flux_pipeline
from .krea2_slice import reference_krea2_pipeline
from .ltx2_slice import reference_ltx2_pipeline
from .measure import Clock, Row, rss_bytes
from .options import FAMILY_VALUES, Options
from .ours import Floor, LoraPair, Ours, round_robin
from .qwen_slice import reference_qwen_pipeline
from .reference import hotswap_times, reference_cycle, reference_pipeline
from .wan_slice import reference_wan_pipeline

__all__ = ["MemoryUse", "OursResults", "ReferenceResults", "RssGrowth", "measure_ours", "measure_reference"]

Say = Callable[[str], None]
Pairs = Mapping[tuple[int, str], LoraPair]
_MIB = 2**20
# What each round-robin method is called in the table, and how it differs from the others.
_METHODS = {
    "(e)": ("(e) floor: fastest exact kernel", "plain tensors, float32 factors ready, no overflow check"),
    "(c)": ("(c) ours, cached adapter", "AdapterStore.for_compute + WeightPatcher.apply"),
    # On a GPU only: the pristine copies in pinned host RAM (the plan's choice for SDXL on an A10G), each
    # restore a host-to-device copy, against the same floor (whose copies are on the device).
    "(g)": ("(g) ours, pristine in pinned host", "as (c), restores over PCIe"),
}


@dataclass(frozen=True)
class MemoryUse:
    """What one cached adapter costs, against the size of its file."""

    rank: int
    fmt: str
    file_bytes: int
    host_tier_bytes: int
    device_tier_bytes: int
    host_ram_bytes: int  # both tiers when the compute device is the CPU

    @property
    def host_tier_over_file(self) -> float:
        return self.host_tier_bytes / self.file_bytes

    @property
    def host_ram_over_file(self) -> float:
        return self.host_ram_bytes / self.file_bytes


@dataclass(frozen=True)
class RssGrowth:
    swaps: int
    rank: int
    before: int
    after: int

    @property
    def growth_mib(self) -> float:
        return (self.after - self.before) / _MIB

    @property
    def growth_percent(self) -> float:
        return 100 * (self.after - self.before) / self.before


@dataclass(frozen=True)
class OursResults:
    rows: tuple[Row, ...]
    memory: tuple[MemoryUse, ...]
    rss: RssGrowth | None
    interleaved: tuple[int, ...]  # ranks where the floor took turns with ours (else it ran alone, first)
    floor_kernels: tuple[tuple[int, str, dict[str, float]], ...] = ()  # (rank, chosen kernel, best ms per kernel)


@dataclass(frozen=True)
class ReferenceResults:
    rows: tuple[Row, ...]
    cycles: int  # reference cycles run in all, the untimed first one included


def measure_ours(unet: nn.Module, pairs: Pairs, options: Options, clock: Clock, say: Say) -> OursResults:
    """Floor (e) and ours (c) and (d) per rank and format; memory per adapter; RSS across many swaps."""
    rows: list[Row] = []
    memory: list[MemoryUse] = []
    kernels: list[tuple[int, str, dict[str, float]]] = []
    rss, interleaved = None, []
    for index, rank in enumerate(options.ranks):
        leak_swaps = options.leak_swaps if rank == min(options.ranks) else 0
        found, together, kernel = _measure_rank(unet, rank, pairs, options, clock, rows, memory, leak_swaps, index == 0)
        rss = rss or found
        kernels.append((rank, *kernel))
        if together:
            interleaved.append(rank)
        gc.collect()  # this rank's adapters and pristine copies go before the next rank's come
        say(
            f"rank {rank}: floor and ours measured ({'taking turns' if together else 'floor first, alone'}); "
            f"floor kernel: {kernel[0]} ({', '.join(f'{k} {v:.0f} ms' for k, v in kernel[1].items())})"
        )
    return OursResults(tuple(rows), tuple(memory), rss, tuple(interleaved), tuple(kernels))


def _measure_rank(
    unet: nn.Module,
    rank: int,
    pairs: Pairs,
    options: Options,
    clock: Clock,
    rows: list[Row],
    memory: list[MemoryUse],
    leak_swaps: int,
    first: bool,
) -> tuple[RssGrowth | None, bool, tuple[str, dict[str, float]]]:
    repeats, device = options.repeats, options.device
    itemsize = torch.empty((), dtype=options.dtype).element_size()
    largest = max(pair.file_size for pair in pairs.values())
    ours = Ours(
        unet,
        device=device,
        dtype=options.dtype,
        max_rank=max(options.ranks),
        cache_bytes=2 * itemsize * largest,
        family=Family(FAMILY_VALUES[options.family]),
    )
    kept = {
        fmt: tuple(
            ours.store.add(ours.prepare(path, f"r{rank}-{fmt}-{i}")) for i, path in enumerate(pairs[(rank, fmt)].paths)
        )
        for fmt in options.formats
    }
    touched = sorted({layer.target for adapter in kept[options.formats[0]] for layer in adapter.layers})
    touched_bytes = sum(ours.table.params[i].nbytes for i in touched)
    adapter_bytes = max(a.nbytes for pair in kept.values() for a in pair) * itemsize // 2
    # The floor shares the patcher's pristine copies, so taking turns needs one copy of the touched weights.
    together = _free_bytes(device) > touched_bytes + 4 * adapter_bytes * len(kept) + 2**30
    samples: dict[str, dict[str, list[float]]] = {}
    kernel: tuple[str, dict[str, float]] = ("", {})
    if not together:
        # No room for the pristine copies beside the adapters: the floor runs first, alone, and frees its copy.
        for fmt in kept:
            samples[fmt], kernel = _floor_alone(ours.table.params, touched, kept[fmt], clock, repeats)
    # The patcher copies a weight the first time it touches it; that must happen while the weights are
    # still the base, before the floor (which fuses outside the patcher) takes turns with it.
    ours.swap(kept[options.formats[0]][0])
    ours.patcher.restore_all()
    host = _pinned_host_patcher(ours, kept[options.formats[0]][0]) if device.type == "cuda" else None
    floor = Floor(ours.table.params, touched, ours.patcher.pristine_copies(touched)) if together else None
    if floor is not None:
        floor.choose(floor.factors(kept[options.formats[0]][0]), clock)
        kernel = (floor.kernel, dict(floor.timings))
    for fmt, adapters in kept.items():
        swaps = _floor_swaps(floor, adapters) if floor is not None else {}
        swaps.update(_ours_swaps(ours, adapters))
        if host is not None:
            swaps.update(_host_swaps(ours, host, adapters))
        samples.setdefault(fmt, {}).update(round_robin(clock, swaps, repeats))
    if floor is not None:
        floor.restore()
    if host is not None:
        host.restore_all()
        host.forget_pristine()
    del floor, host
    rss = None
    for fmt, adapters in kept.items():
        for key, (method, note) in _METHODS.items():
            if key in samples[fmt]:
                rows.append(Row(rank, fmt, method, tuple(samples[fmt][key]), note))
        memory.append(_memory_use(rank, fmt, pairs[(rank, fmt)], adapters[0], ours.store.for_compute(adapters[0])))
        if leak_swaps and rss is None:
            rss = _rss_growth(ours, adapters, leak_swaps, rank)
        rows.extend(_first_seen(ours, rank, fmt, pairs[(rank, fmt)], clock, repeats, warm_up=first))
        first = False
    ours.reset()
    return rss, together, kernel


def _pinned_host_patcher(ours: Ours, adapter: PreparedAdapter) -> WeightPatcher:
    """A second patcher over the same weights keeping its pristine copies in pinned host memory, its copies taken
    now, while the weights are the base (every method rewrites each touched weight from its own copy)."""
    host = WeightPatcher(ours.table.params, torch.device("cpu"), pin=True)
    host.apply((ActiveAdapter(ours.store.for_compute(adapter), 1.0),))
    host.restore_all()
    return host


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def _floor_swaps(floor: Floor, adapters: Sequence[PreparedAdapter]) -> dict[str, Callable[[int], object]]:
    factors = tuple(floor.factors(adapter) for adapter in adapters)
    return {"(e)": lambda i: floor.swap(factors[i % 2])}


def _ours_swaps(ours: Ours, adapters: Sequence[PreparedAdapter]) -> dict[str, Callable]:
    return {"(c)": lambda i: ours.swap(adapters[i % 2])}


def _host_swaps(ours: Ours, host: WeightPatcher, adapters: Sequence[PreparedAdapter]) -> dict[str, Callable]:
    return {"(g)": lambda i: host.apply((ActiveAdapter(ours.store.for_compute(adapters[i % 2]), 1.0),))}


def _floor_alone(
    params: Sequence[torch.Tensor], touched: Sequence[int], adapters: Sequence[PreparedAdapter], clock: Clock, repeats
) -> tuple[dict[str, list[float]], tuple[str, dict[str, float]]]:
    floor = Floor(params, touched)
    floor.choose(floor.factors(adapters[0]), clock)
    samples = round_robin(clock, _floor_swaps(floor, adapters), repeats)
    floor.restore()
    return samples, (floor.kernel, dict(floor.timings))


def _memory_use(rank: int, fmt: str, pair: LoraPair, host: PreparedAdapter, compute: PreparedAdapter) -> MemoryUse:
    on_cpu = compute.device.type == "cpu" and compute is not host
    return MemoryUse(
        rank=rank,
        fmt=fmt,
        file_bytes=pair.file_size,
        host_tier_bytes=host.nbytes,
        device_tier_bytes=compute.nbytes,
        host_ram_bytes=host.nbytes + (compute.nbytes if on_cpu else 0),
    )


def _rss_growth(ours: Ours, adapters: Sequence[PreparedAdapter], swaps: int, rank: int) -> RssGrowth:
    gc.collect()
    before = rss_bytes()
    for index in range(swaps):
        ours.swap(adapters[index % 2])
    gc.collect()
    return RssGrowth(swaps, rank, before, rss_bytes())


def _first_seen(
    ours: Ours, rank: int, fmt: str, pair: LoraPair, clock: Clock, repeats: int, *, warm_up: bool
) -> list[Row]:
    if warm_up:  # the first prepare pays one-time costs (imports, allocator growth)
        ours.first_seen(pair.paths[1], f"r{rank}-{fmt}-warm-up", clock)
    timed = [ours.first_seen(pair.paths[i % 2], f"r{rank}-{fmt}-new{i}", clock) for i in range(repeats)]
    rows = [Row(rank, fmt, "(d) ours, first-seen file", tuple(sum(t) for t in timed), "file in the page cache")]
    for index, phase in enumerate(("read header + prepare", "keep in the store", "apply")):
        rows.append(Row(rank, fmt, f"    (d) {phase}", tuple(t[index] for t in timed)))
    return rows


def measure_reference(unet: nn.Module, pairs: Pairs, options: Options, clock: Clock, say: Say) -> ReferenceResults:
    """The reference cycle (a), phase by phase, and diffusers' hotswap (b), per rank and format.

    Every cycle, the untimed first one included, fuses and unfuses on the same weights, which is
    what makes them drift.
    """
    pipelines = {"flux": reference_flux_pipeline, "qwen": reference_qwen_pipeline, "wan": reference_wan_pipeline}
    pipelines["krea2"] = reference_krea2_pipeline
    pipelines["ltx2"] = reference_ltx2_pipeline
    pipe = pipelines.get(options.family, reference_pipeline)(unet)
    rows: list[Row] = []
    first = pairs[(options.ranks[0], options.formats[0])].paths
    reference_cycle(pipe, first[1], "warm-up", clock)  # one-time costs: imports, PEFT's first injection
    cycles = 1
    fewer = options.reference_repeats < options.repeats
    for rank in options.ranks:
        for fmt in options.formats:
            paths = pairs[(rank, fmt)].paths
            timed = []
            for index in range(options.reference_repeats):
                timed.append(reference_cycle(pipe, paths[index % 2], f"request{cycles}", clock))
                cycles += 1
            note = f"fewer repeats ({options.reference_repeats}): slow" if fewer else ""
            rows.append(Row(rank, fmt, "(a) reference cycle", tuple(t.total for t in timed), note))
            for phase in ("load", "fuse", "unfuse", "unload"):
                rows.append(Row(rank, fmt, f"    (a) {phase}", tuple(getattr(t, phase) for t in timed)))
            samples = hotswap_times(pipe, paths, rank=rank, repeats=options.repeats, clock=clock)
            rows.append(Row(rank, fmt, "(b) diffusers hotswap", tuple(samples), "unfused: slower inference"))
        say(f"rank {rank}: reference cycle and hotswap measured")
    return ReferenceResults(tuple(rows), cycles)
