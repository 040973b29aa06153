"""The parts one pool's `Engine` is built from (`engine.pools.engine`): its target table, pristine-copy budget,
weight patcher, adapter store, disk cache and preparer, each sized from the settings and the memory plan.

Built once per engine, in this order: pinned memory is configured before anything is pinned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.caches.disk import DiskCache
from engine.caches.store import AdapterStore
from engine.events import EngineEvents
from engine.families.spec import FamilySpec
from engine.formats.pivotal import TextEncoders
from engine.formats.targets import TargetTable
from engine.hostmem import configure_pinned
from engine.pipeline.loading import LoadedPipeline
from engine.pools.hostplan import pristine_budget
from engine.pools.plan import scratch_bytes
from engine.prepare.loadgate import LoadGate
from engine.prepare.preparation import Preparer
from engine.prepare.resolve import AdapterResolver
from engine.prepare.stages import Stages
from engine.settings import Settings
from engine.storage import BRANCHED
from engine.weights.branches import BranchedPatcher, Branches
from engine.weights.swap import WeightPatcher

__all__ = ["EngineParts", "build_parts"]


@dataclass(frozen=True)
class EngineParts:
    table: TargetTable
    encoders: TextEncoders
    patcher: WeightPatcher | BranchedPatcher
    store: AdapterStore
    disk_cache: DiskCache | None
    preparer: Preparer
    pristine_budget: int
    pristine_device_bytes: int
    scratch_device_bytes: int


def _target_table(family: FamilySpec, components: dict[str, Any]) -> TargetTable:
    """The pool's weights a LoRA may change, with the family's converter and namings."""
    return TargetTable(
        components,
        denoiser=family.denoiser,
        convert_lora=family.convert_lora,
        full_differences=family.full_differences,
        lycoris_modules=family.lycoris_modules,
        unapplied_parts=family.unapplied_parts,
    )


def build_parts(
    loaded: LoadedPipeline,
    settings: Settings,
    resolver: AdapterResolver,
    events: EngineEvents,
    *,
    disk_cache: DiskCache | None,
    host_pristine: int | None,
) -> EngineParts:
    """One pool's parts; `disk_cache` is the Hub cache's pruner when pools share one (else made here);
    `host_pristine`: what the memory plan left in host RAM for its pristine copies there (HOST_RAM_BYTES)."""
    per_call = settings.per_call
    family = loaded.family
    components = {c: getattr(loaded.pipe, c) for c in loaded.components}
    table = _target_table(family, components)
    # The served tokenizers and token embeddings, for pivotal-tuning LoRAs' tokens (engine.formats.pivotal).
    encoders = TextEncoders(loaded.pipe, loaded.components)
    on_device = loaded.device.type != "cpu" and not per_call and settings.pristine_store != "cpu"
    # On ZeroGPU the main process must not touch CUDA, and pinning host memory does: nothing pins there.
    pin = loaded.device.type == "cuda" and not settings.zero_gpu
    if pin:
        # Before anything is pinned: large pinned buffers at their size, not a power of two (engine.hostmem).
        configure_pinned()
    # What the pristine copies may take on the device at most: the residency charges it while the pool is there.
    touchable = sum(p.nbytes for p in table.params)
    allowance = touchable if settings.pristine_bytes is None else min(settings.pristine_bytes, touchable)
    sizes = [p.nbytes for p in table.params]
    budget, budget_setting = pristine_budget(
        sizes, pinned=pin and not on_device, pristine_bytes=settings.pristine_bytes, host_pristine=host_pristine
    )
    # The swap's float32 scratch buffers on the device while the pool is there (the residency charges them).
    largest = max((p.numel() for p in table.params), default=0)
    fused = WeightPatcher(
        table.params,
        loaded.device if on_device else torch.device("cpu"),
        budget=budget,
        pin=pin,
        budget_setting=budget_setting,
        second=_second_stage(table, family.second_stage),
    )
    # Branched pool (fp8, int4, GGUF): the stored components' LoRAs as branches (`_branched`); the encoders' fuse.
    patcher = _branched(loaded, table, fused) if loaded.storage in BRANCHED else fused
    store = _make_store(loaded, settings, events, pin=pin)
    if disk_cache is None and (resolver.uses_hub or resolver.civitai_dir is not None):
        disk_cache = _make_disk_cache(loaded, settings, resolver, store)
    preparer = _make_preparer(loaded, settings, resolver, store, table, encoders, disk_cache)
    return EngineParts(
        table=table,
        encoders=encoders,
        patcher=patcher,
        store=store,
        disk_cache=disk_cache,
        preparer=preparer,
        pristine_budget=budget,
        pristine_device_bytes=allowance if on_device else 0,
        scratch_device_bytes=scratch_bytes(largest) if loaded.device.type != "cpu" and not per_call else 0,
    )


def _branched(loaded: LoadedPipeline, table: TargetTable, fused: WeightPatcher) -> BranchedPatcher:
    """The stored components' LoRAs (the denoiser's; Wan 2.2 A14B's transformer_2's too, at `scale_2`) as branches
    beside their weights, the rest fused."""
    family = loaded.family
    more = {c: getattr(loaded.pipe, c) for c in family.stored if c != family.denoiser}
    branches = Branches(table, loaded.denoiser, more=more, second=_second_stage(table, family.second_stage))
    return BranchedPatcher(fused, branches)


def _make_store(loaded: LoadedPipeline, settings: Settings, events: EngineEvents, *, pin: bool) -> AdapterStore:
    return AdapterStore(
        host_budget=settings.host_cache_bytes,
        device_budget=settings.device_cache_bytes,
        device=loaded.device,
        dtype=loaded.dtype,
        # On the CPU the host copy is the compute copy; on ZeroGPU device memory does not outlive a call.
        use_device_tier=loaded.device.type != "cpu" and not settings.per_call,
        pin=pin,
        events=events,
    )


def _make_disk_cache(
    loaded: LoadedPipeline, settings: Settings, resolver: AdapterResolver, store: AdapterStore
) -> DiskCache:
    return DiskCache(
        settings.disk_cache_bytes,
        cache_dir=resolver.cache_dir,
        civitai_dir=resolver.civitai_dir,
        download_timeout_s=settings.hub_timeout_s,
        # The budget is for LoRAs: the served model's own repos are never pruned.
        keep_repos={settings.model_id, settings.base_model_id, loaded.model_id, settings.vae_id or ""},
        in_use=store.in_use,
    )


def _make_preparer(
    loaded: LoadedPipeline,
    settings: Settings,
    resolver: AdapterResolver,
    store: AdapterStore,
    table: TargetTable,
    encoders: TextEncoders,
    disk_cache: DiskCache | None,
) -> Preparer:
    return Preparer(
        resolver,
        store,
        table,
        encoders,
        served_base=loaded.base_model_id,
        max_rank=settings.max_rank,
        disk=disk_cache,
        gate=LoadGate(workers=settings.prepare_workers, budget=settings.prepare_inflight_bytes),
        # Prefetches load one at a time, beside the requests' loads and never in their way.
        prefetch_gate=LoadGate(workers=1, budget=settings.prepare_inflight_bytes),
        # LoHa's and DoRA's ΔW kept from preparation on the CPU, where recomputing it is slow
        # (engine.formats.deltas): a quarter of the host cache, so a kept ΔW never crowds out more than a few
        # other adapters.
        delta_budget=settings.host_cache_bytes // 4 if loaded.device.type == "cpu" else 0,
        stages=_stages(table, loaded.family),
    )


def _second_stage(table: TargetTable, component: str | None) -> frozenset[int]:
    """The weight indices of a two-stage pool's second stage (`FamilySpec.second_stage`; none: empty)."""
    if component is None:
        return frozenset()
    return frozenset(i for i, name in enumerate(table.names) if name.startswith(f"{component}."))


def _stages(table: TargetTable, family: FamilySpec) -> Stages | None:
    """A two-stage pool's reading of its LoRA files' stages (engine.prepare.stages); None elsewhere."""
    if family.second_stage is None or family.stage_of is None:
        return None
    return Stages(_second_stage(table, family.second_stage), family.stage_of)
