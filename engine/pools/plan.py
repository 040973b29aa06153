"""The start-up memory plan: what each pool keeps on the GPU and in host RAM, checked before anything loads and
again after.

The plan takes the first that fits: all resident with pristine copies; copies on the device where they fit
(`PRISTINE_STORE=auto`); taking turns (`POOL_OFFLOAD=on`); then with the components a family may run from host
RAM left there; host RAM within `HOST_RAM_BYTES`. Each denoiser is stored as `QUANTIZE` says: `auto` tries all
of that in native storage first, then quantizes (fp8, `engine.storage`) one pool more at a time, the largest
denoiser first, then int4 the same way, until the pools fit: the smallest storage that fits, never one that
loads and is refused. A plan that cannot fit is refused, before loading when the families declare
their sizes, naming what would fit. No plan where the device has no bound (CPU, ZeroGPU).
What counts against the device: docs/internals.md, "engine/pools/plan.py".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch

from engine.errors import SettingsError
from engine.pools.hostplan import MIN_CACHE, fit_host, host_need, host_refusal
from engine.pools.needs import (
    PoolNeed,
    declared_needs,
    largest_values,
    loaded_need,
    pipeline_modules,
    scratch_bytes,
)
from engine.pools.placement import MemoryPlan, Placement, PlanOptions, gib
from engine.storage import QUANTIZED_ORDER, Storage, unplanned_storage

__all__ = [
    "GPUS",
    "MemoryPlan",
    "Placement",
    "PlanOptions",
    "PoolNeed",
    "declared_needs",
    "device_memory",
    "largest_values",
    "loaded_need",
    "pipeline_modules",
    "plan_memory",
    "scratch_bytes",
    "storage_to_load",
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
# Declared, not measured here (no GPU was lent): torch's CUDA context with CUDA 12's lazy module loading and
# cuBLAS's workspaces, reported at 300-800 MiB on recent GPUs; `bench/gpu_check.sh` is where to measure it.
CUDA_CONTEXT_BYTES = 768 * 2**20


def device_memory(device: torch.device, *, per_call: bool) -> int | None:
    """The device's memory where the plan must keep a bound; None on the CPU and on ZeroGPU (lent per call)."""
    if device.type != "cuda" or per_call:
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def storage_to_load(first: MemoryPlan | None, options: PlanOptions, name: str) -> Storage:
    """Pool `name`'s denoiser storage, decided once, before it loads: the plan's where one is made before loading;
    else as its QUANTIZE gives it without a plan (`auto`: native, nothing to fit yet). The plan made after loading
    keeps what loaded, and the pool's status reports what loaded (`LoadedPipeline.storage`)."""
    return first.storage(name) if first is not None else unplanned_storage(options.quantize_of(name))


def plan_memory(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> MemoryPlan:
    """The first plan that fits `total` bytes of device memory; SettingsError says what would fit otherwise."""
    chosen = _select(needs, total, options)
    if chosen is None:
        raise SettingsError(_paused_refusal(needs, total, options) or _refusal(needs, total, options))
    plan, stored = chosen
    auto = tuple(n.name for n in stored if n.storage in QUANTIZED_ORDER and options.quantize_of(n.name) == "auto")
    plan = replace(plan, auto_quantized=auto)
    # A pool with nothing touchable (a quantized denoiser, no text encoder LoRAs) has no copies to place.
    placed = zip(stored, plan.placements, strict=True)
    ideal = plan.resident and all((p.pristine or not n.touchable) and not p.host_components for n, p in placed)
    if ideal or options.pristine_store == "cpu":
        return plan
    return replace(plan, smaller_pristine=_smaller_pristine(stored, total, options))


def _storages(needs: Sequence[PoolNeed], options: PlanOptions) -> Iterator[tuple[PoolNeed, ...]]:
    """The pools with their denoisers' storage, in the order the plan tries them: as QUANTIZE fixes them (native
    under `auto`); then under `auto` one more pool in fp8 at a time, the one it saves most on first (the largest
    denoiser), where it saves anything; then, all of those in fp8, one more in int4 at a time the same way."""
    modes = [options.quantize_of(n.name) for n in needs]
    chosen = [_stored(n, m) for n, m in zip(needs, modes, strict=True)]
    yield tuple(chosen)
    for storage in QUANTIZED_ORDER:
        auto = [i for i, (n, m) in enumerate(zip(needs, modes, strict=True)) if m == "auto" and n.saves(storage) > 0]
        for index in sorted(auto, key=lambda i: needs[i].saves(storage), reverse=True):
            chosen[index] = _stored(needs[index], storage)
            yield tuple(chosen)


def _stored(need: PoolNeed, quantize: str) -> PoolNeed:
    """`need` in the storage a QUANTIZE value fixes (`auto`, `off`: native; a GGUF pool's need is its file's
    storage already), where its size is known."""
    return {"fp8": need.fp8, "int4": need.int4}.get(quantize) or need


def _select(
    needs: Sequence[PoolNeed], total: int, options: PlanOptions
) -> tuple[MemoryPlan, tuple[PoolNeed, ...]] | None:
    """The first plan that fits, over the storages QUANTIZE allows, and the needs in the storage it chose."""
    for stored in _storages(needs, options):
        plan = _first_fit(stored, total, options)
        if plan is not None:
            return _relaxed(needs, stored, plan, total, options)
    return None


def _relaxed(
    needs: Sequence[PoolNeed], stored: tuple[PoolNeed, ...], plan: MemoryPlan, total: int, options: PlanOptions
) -> tuple[MemoryPlan, tuple[PoolNeed, ...]]:
    """`stored` with each pool `auto` quantized back in the largest storage that still fits, the smallest denoiser
    first: the int4 tier is tried with every pool in fp8, but a pool that fits in fp8 or native beside the int4
    ones keeps that."""
    chosen = list(stored)
    order: tuple[Storage, ...] = ("native", *QUANTIZED_ORDER)
    auto = [
        i for i, n in enumerate(needs) if options.quantize_of(n.name) == "auto" and chosen[i].storage in QUANTIZED_ORDER
    ]
    for index in sorted(auto, key=lambda i: needs[i].fp8_saves):
        for storage in order[: order.index(chosen[index].storage)]:
            trial = [*chosen[:index], _stored(needs[index], storage), *chosen[index + 1 :]]
            fitted = _first_fit(trial, total, options)
            if fitted is not None:
                chosen, plan = trial, fitted
                break
    return plan, tuple(chosen)


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


def _working(needs: Sequence[PoolNeed], options: PlanOptions) -> int:
    """The CUDA context, one pool's working memory (one pool denoises at a time, or one step at a time:
    `engine.pipeline.stepshare`), with step sharing the paused runs' state (a pool runs one request at a time, so
    at most one is paused per pool, and one pool's run is not paused but running: all pools' but the smallest; a
    pool alone never pauses), and, with CUDA graphs, every pool's graph pool (each holds its captured shapes'
    activations apart)."""
    graphs = sum(n.working for n in needs) if options.graphs else 0
    paused = _paused(needs) if options.step_sharing else 0
    return CUDA_CONTEXT_BYTES + max(n.working for n in needs) + paused + graphs


def _paused(needs: Sequence[PoolNeed]) -> int:
    """The most paused state at once: every pool's paused run but one (the one running)."""
    return sum(n.paused for n in needs) - min(n.paused for n in needs) if len(needs) > 1 else 0


def _paused_refusal(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> str | None:
    """Why the pools do not fit when only their paused runs' state is in the way (None otherwise)."""
    if not options.step_sharing or _select(needs, total, replace(options, step_sharing=False)) is None:
        return None
    each = ", ".join(f"{n.name} {gib(n.paused)}" for n in needs)
    return (
        f"the pools fit this GPU's {gib(total)} only without step sharing: with DEVICE_SHARING=step each pool's "
        f"paused run keeps its latents and embeddings on the device ({each}; {gib(_paused(needs))} in "
        "all) beside one working memory; accepted: DEVICE_SHARING=run (the whole-run lock), or fewer pools"
    )


def _room(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> int:
    return total - _working(needs, options) - len(needs) * options.adapter_cache


def _first_fit(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> MemoryPlan | None:
    room = _room(needs, total, options)
    for host in (False, True) if any(n.host_able for n in needs) else (False,):
        for placements, resident in _candidates(needs, options, room, host=host):
            if (sum if resident else max)(p.nbytes for p in placements) > room:
                continue
            placed = fit_host(needs, placements, resident=resident, options=options)
            if placed is not None:
                return MemoryPlan(total, room, placed, resident, host_budget=options.host_ram)
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
    components = tuple(c for c, _ in left)
    return Placement(need.name, weights, allowance, components, need.scratch, storage=need.storage, quant=need.quant)


def _refusal(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> str:
    device_only = _select(needs, total, replace(options, host_ram=None))
    if device_only is not None:
        plan, stored = device_only
        held = [
            host_need(n, p, resident=plan.resident, options=options)
            for n, p in zip(stored, plan.placements, strict=True)
        ]
        return host_refusal(needs, held, options, fits=lambda some, changed: _fits(some, total, changed))
    # The pools as stored at the last try (under QUANTIZE=auto, every pool it may quantize in fp8).
    *_, shown = _storages(needs, options)
    own = ", ".join(
        f"{n.name} {gib(n.weights)}"
        + (f" (denoiser in {n.storage}{' ' + n.quant if n.quant else ''})" if n.storage != "native" else "")
        + (f" (its pristine copies up to {gib(_allowance(n, options.pristine_bytes))})" if n.touchable else "")
        for n in shown
    )
    # (A GGUF pool's storage is its file's: no QUANTIZE value of its own.)
    quantize = ", ".join(sorted({options.quantize_of(n.name) for n in needs} - {"gguf"}) or [options.quantize])
    head = (
        f"the pools do not fit this GPU's {gib(total)}, of which {gib(_working(needs, options))} is kept for "
        "inference (the CUDA context, one pool's working memory and any CUDA graphs) and "
        f"{gib(options.adapter_cache)} per pool for adapters (DEVICE_CACHE_BYTES): {own}, with "
        f"POOL_OFFLOAD={'on' if options.offload else 'off'}, PRISTINE_STORE={options.pristine_store} and "
        f"QUANTIZE={quantize}"
    )
    return f"{head}; accepted: {'; or '.join(_would_fit(needs, total, options))}"


def _fits(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> bool:
    return _select(needs, total, options) is not None


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
    if not said:
        out.extend(_quantize_advice(needs, total, options) or _gguf_advice(needs, total, options))
    if not said and len(out) == (1 if kept else 0):
        out.extend(_rank_advice(needs, total, options))
    cache = _largest_cache(needs, total, relaxed)
    if cache is not None and cache < options.adapter_cache and not said:
        out.append(f"DEVICE_CACHE_BYTES={cache // 2**20}MiB" + (f" with {' and '.join(changes)}" if changes else ""))
    larger = next((name for name, size in GPUS if size > total and _fits(needs, size, options)), None)
    out.append(f"a larger GPU: {larger}" if larger is not None else f"a GPU larger than {GPUS[-1][0]}")
    return out


def _quantize_advice(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> list[str]:
    """Quantizing, where it would fit, naming the storage that would: `QUANTIZE=auto` where every pool's storage is
    QUANTIZE's; where a pool's is fixed (its MODELS item, or the storage it loaded in: `auto` quantizes only
    before loading), fp8 or int4 for those."""
    quantized = replace(options, quantize="auto", pool_quantize=())
    chosen = _select(needs, total, quantized) if quantized != options else None
    if chosen is None:
        return []
    storages = [s for s in QUANTIZED_ORDER if any(n.storage == s for n in chosen[1])]
    if not options.pool_quantize:
        return [f"QUANTIZE=auto (denoisers in {' and '.join(storages)} where needed, LoRAs as branches beside them)"]
    advice = []
    for storage in storages:
        names = [n.name for n in chosen[1] if n.storage == storage and options.quantize_of(n.name) != storage]
        if not names:
            continue
        one = len(names) == 1
        said = (
            f"QUANTIZE={storage}, or its MODELS item ending in :{storage}"
            if one
            else (f"their MODELS items ending in :{storage}")
        )
        beside = "it" if one else "them"
        advice.append(f"QUANTIZE={storage} for {' and '.join(names)} ({said}; LoRAs as branches beside {beside})")
    return advice


def _gguf_advice(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> list[str]:
    """For each GGUF pool, the largest served type of fewer bits whose file would fit, the others as they are."""
    advice = []
    for index, need in enumerate(needs):
        fits = (s for s in need.smaller if _fits([*needs[:index], s, *needs[index + 1 :]], total, options))
        smaller = next(fits, None)
        if smaller is not None:
            advice.append(
                f"a GGUF file of type {smaller.quant} for {need.name} (its weights {gib(smaller.weights)} in all, "
                f"against {gib(need.weights)} from this file)"
            )
    return advice


def _at_rank(need: PoolNeed, rank: int, options: PlanOptions) -> PoolNeed:
    """`need` (and its quantized alternatives) with branch buffers of `rank` instead of LORA_MAX_RANK's."""
    weights = need.weights - need.branches + need.branches * rank // options.rank
    fp8, int4 = (None if n is None else _at_rank(n, rank, options) for n in (need.fp8, need.int4))
    smaller = tuple(_at_rank(n, rank, options) for n in need.smaller)
    return replace(need, weights=weights, fp8=fp8, int4=int4, smaller=smaller)


def _rank_advice(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> list[str]:
    """The largest smaller LORA_MAX_RANK (64, 32, 16) with which quantized pools' branch buffers leave room, alone
    or with a smaller DEVICE_CACHE_BYTES; LoRAs of higher rank are then refused on those pools."""
    quantized = [n for n in needs if n.branches or (n.fp8 and n.fp8.branches) or (n.int4 and n.int4.branches)]
    if not quantized or not options.rank:
        return []
    for rank in (r for r in (64, 32, 16) if r < options.rank):
        smaller = [_at_rank(n, rank, options) for n in needs]
        said = f"LORA_MAX_RANK={rank} (branch buffers of that rank; LoRAs of higher rank refused on quantized pools)"
        if _fits(smaller, total, options):
            return [said]
        cache = _largest_cache(smaller, total, options)
        if cache is not None:
            return [f"{said} with DEVICE_CACHE_BYTES={cache // 2**20}MiB"]
    return []


def _largest_cache(needs: Sequence[PoolNeed], total: int, options: PlanOptions) -> int | None:
    """The largest DEVICE_CACHE_BYTES, in 256 MiB steps from the current one down, with which the pools fit."""
    cache = options.adapter_cache - options.adapter_cache % MIN_CACHE
    while cache >= MIN_CACHE:
        if _fits(needs, total, replace(options, adapter_cache=cache)):
            return cache
        cache -= MIN_CACHE
    return None
