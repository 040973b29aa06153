"""Pools: one engine per served base model, and the router that sends each request to one of them.

Each pool is an `Engine` (its own warm pipeline, scheduler, adapter store, exact swap and preview
decoder) over one base; the first is the default. A request goes to the pool its LoRAs belong to
(`engine.pools.routing`: card, metadata, then shapes); several LoRAs must share one pool. A request without a
LoRA goes to the base it names, or the default pool. Pipelines that do not all fit the device take
turns (`engine.pools.residency`), least recently used out first. `build_pools` loads them at start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from cachetools import LRUCache

from engine.caches.disk import DiskCache
from engine.compare import MAX_COMPARE_LORAS
from engine.families.origin import FileEvidence, LoraOrigin, judge_origin
from engine.formats.adapters import AdapterKey
from engine.normalise import normalise_loras
from engine.outcomes import PoolMemory, PoolStatus, ServedPool
from engine.pipeline.loading import LoadedPipeline, resolve_device
from engine.pools.engine import Engine
from engine.pools.plan import (
    MemoryPlan,
    PlanOptions,
    declared_needs,
    device_memory,
    loaded_need,
    pipeline_modules,
    plan_memory,
)
from engine.pools.residency import Residency
from engine.pools.routing import PoolInfo, described_pick, named_pool, routed
from engine.pools.startup import compiled, load_pipelines, pools_settings
from engine.prepare.resolve import AdapterResolver, AdapterSource
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import Settings
from engine.storage import BRANCHED, planned_quantize
from lora_catalog.entries import Family

__all__ = ["Pool", "Pools", "Route", "build_pools", "lora_origin", "pool_info"]

logger = logging.getLogger(__name__)

# Routing decisions are cached by file identity (a Hub sha or a local file's size and mtime), which never changes.
_ROUTE_CACHE = 4096


@dataclass(frozen=True)
class Pool:
    """One served base: its engine, what routing knows of it, and its place in the list (0: the default)."""

    engine: Engine
    info: PoolInfo
    index: int

    @property
    def base_model_id(self) -> str:
        return self.info.base_model_id

    @property
    def model_id(self) -> str:
        return self.engine.loaded.model_id

    @property
    def family(self) -> Family:
        return self.info.family


@dataclass(frozen=True)
class Route:
    """Where a request goes, and why (logged)."""

    pool: Pool
    reason: str


class Pools:
    """The served pools, the router over them, and their device residency."""

    def __init__(self, engines: Sequence[Engine], resolver: AdapterResolver, residency: Residency) -> None:
        if not engines:
            raise ValueError("Pools needs at least one engine")
        self._pools = tuple(Pool(engine, pool_info(engine), index) for index, engine in enumerate(engines))
        bases = [p.base_model_id.lower() for p in self._pools]
        if len(set(bases)) != len(bases):
            raise ValueError(f"two pools serve one base: {', '.join(bases)}")
        self._resolver = resolver
        self._residency = residency
        for engine in engines:
            # In order: the default pool gets the device first.
            residency.add(
                engine.loaded.base_model_id,
                pipeline_modules(engine.loaded),
                before_leaving=engine.prepare_to_leave_device,
                # What it holds on the device besides its weights: pristine copies there and the swap's scratch.
                pristine=engine.pristine_device_bytes + engine.scratch_device_bytes,
            )
        self._routes: LRUCache[AdapterKey, tuple[int | None, str]] = LRUCache(maxsize=_ROUTE_CACHE)
        self._routes_lock = threading.Lock()

    @classmethod
    def single(cls, engine: Engine) -> Pools:
        """One pool around `engine`, always resident (the MODEL_ID shorthand, and tests)."""
        return cls([engine], engine.resolver, Residency(engine.loaded.device, None))

    # -- what is served --------------------------------------------------------------------------

    @property
    def pools(self) -> tuple[Pool, ...]:
        return self._pools

    @property
    def default(self) -> Pool:
        return self._pools[0]

    @property
    def served_bases(self) -> tuple[str, ...]:
        return tuple(p.base_model_id for p in self._pools)

    def pool_for_base(self, base: str) -> Pool:
        """The pool a request names by `base` (its base or model repo id, any case); 404 naming the served ones."""
        return self._pools[named_pool(self._pools, base)]

    # -- routing ---------------------------------------------------------------------------------

    def route(self, request: GenerateRequest, base: str = "") -> Route:
        """The pool for `request`: its LoRAs' pool, else the named base's, else the default."""
        named = named_pool(self._pools, base) if base.strip() else None
        if len(self._pools) == 1:
            # Nothing to choose: the engine's own checks judge each LoRA against the one base.
            return Route(self.default, "only pool")
        # Checked as the engine checks them (refs, revisions, file names), so routing reads only valid names.
        specs = normalise_loras(request.loras, max(self.default.engine.limits.max_loras, MAX_COMPARE_LORAS))
        index, reason = routed(self._pools, named, [(spec.ref, *self._lora_pool(spec)) for spec in specs])
        pool = self._pools[index]
        logger.info("route %s -> pool %s (%s)", [s.ref for s in specs] or "no LoRA", pool.base_model_id, reason)
        return Route(pool, reason)

    def _lora_pool(self, spec: LoraSpec) -> tuple[int | None, str]:
        label = f"LoRA {spec.ref!r}"
        source = self._resolver.locate(spec)
        with self._routes_lock:
            if source.key in self._routes:
                return self._routes[source.key]
        started = time.perf_counter()
        infos = [p.info for p in self._pools]
        origin = lora_origin(self._resolver, source, self.default.engine.disk_cache)
        decision = described_pick(label, origin, infos)
        index = decision[0]
        logger.info(
            "%s belongs to %s by its %s (%.1f ms)",
            label,
            self._describe(index),
            origin.how,
            (time.perf_counter() - started) * 1000,
        )
        with self._routes_lock:
            self._routes[source.key] = decision
        return decision

    def _describe(self, index: int | None) -> str:
        return self._pools[index].base_model_id if index is not None else "an undetermined base"

    # -- running ---------------------------------------------------------------------------------

    @contextmanager
    def on_device(self, pool: Pool) -> Iterator[float]:
        """Hold `pool`'s pipeline on the device for the block (moving it in if it waits in host RAM)."""
        with self._residency.use(pool.base_model_id) as moved_s:
            yield moved_s

    # -- status ----------------------------------------------------------------------------------

    def served(self) -> tuple[ServedPool, ...]:
        """What every transport offers of each pool (the default first)."""
        return tuple(
            ServedPool(p.base_model_id, p.engine.loaded.model_id, str(p.family), p.engine.defaults, p is self.default)
            for p in self._pools
        )

    def residency_snapshot(self) -> tuple[PoolMemory, ...]:
        """Where each pool's pipeline is now."""
        return self._residency.snapshot()

    def status(self) -> tuple[PoolStatus, ...]:
        memory = {m.name: m for m in self._residency.snapshot()}
        return tuple(
            PoolStatus(p.base_model_id, str(p.family), p is self.default, memory[p.base_model_id], p.engine.status())
            for p in self._pools
        )

    def close(self) -> None:
        for pool in self._pools:
            pool.engine.close()


def lora_origin(resolver: AdapterResolver, source: AdapterSource, disk: DiskCache | None) -> LoraOrigin:
    """What a located LoRA says of its base: its card and tags, else its file (fetched here, into the Hub cache
    the engine's preparation then reads; only its header is read). A download is held against pruning while
    its header is read, and pruning is scheduled after it, as the preparation's own downloads are."""

    def read_file() -> FileEvidence:
        if disk is None or source.local_path is not None:
            header = resolver.header(source, resolver.fetch(source))
        else:
            try:
                with disk.hold(source.key):
                    header = resolver.header(source, resolver.fetch(source))
            finally:
                disk.schedule()
        return header.metadata, {name: info.shape for name, info in header.tensors.items()}

    return judge_origin(source.declared_bases, read_file, declared_family=source.declared_family)


def pool_info(engine: Engine) -> PoolInfo:
    """The base, family and widths of an engine's pipeline (read as its family reads them)."""
    loaded = engine.loaded
    family = loaded.family
    encoders = {c: getattr(loaded.pipe, c) for c in family.components if c != family.denoiser}
    widths = family.signature.pipeline_widths(loaded.denoiser, encoders)
    return PoolInfo(loaded.base_model_id, family.family, widths.denoiser, widths.text)


def build_pools(
    settings: Settings,
    resolver: AdapterResolver,
    load: Callable[..., LoadedPipeline],
    *,
    warm: bool,
    memory: Callable[[torch.device], int | None] | None = None,
) -> Pools:
    """Load every pool of `settings` (the default first) and place them on the device by the memory plan.

    The plan (`engine.pools.plan`) is checked before anything loads, from the families' declared sizes, and again
    on the loaded pipelines; it sets each pool's pristine store (`PRISTINE_STORE=auto`) and the device's room.
    One pool is loaded and warmed as before pools existed. Several wait in host RAM while the plan places them
    (when there is one) and warm up on first use, unless `COMPILE` is set: then each is warmed up and compiled at
    start-up, on the device in turn (with `warm`: not on ZeroGPU, where no GPU exists at start). They share one
    Hub-cache pruner, which keeps every pool's model files and every pool's adapters in use. `memory`: the
    device's memory in bytes, None for no bound (tests give one; by default the GPU's, or none on the CPU and
    ZeroGPU).
    """
    device = resolve_device(settings.device)
    total = memory(device) if memory is not None else device_memory(device, per_call=settings.per_call)
    options = PlanOptions.of(settings)
    declared = declared_needs(settings, device) if total is not None else None
    # Refused before anything is downloaded or loaded; its choice of components left in host RAM is final.
    first = plan_memory(declared, total, options) if total is not None and declared is not None else None
    own_settings = pools_settings(settings)
    loaded = load_pipelines(settings, own_settings, load, first, options, warm=warm, park=total is not None)
    _log_storage(loaded, first, options)
    # Once loaded, measured, each denoiser in the storage it loaded in (never changed behind its back).
    kept = options.keeping((lp.base_model_id, lp.storage) for lp in loaded)
    needs = [loaded_need(lp, rank=settings.lora_max_rank, group_size=settings.int4_group_size) for lp in loaded]
    plan = plan_memory(needs, total, kept) if total is not None else None
    if plan is not None:
        logger.info("memory plan: %s", plan.describe())
    if len(loaded) > 1 and settings.compile != "off" and warm:
        # Compiling is warming up: each pool on the device in turn, once, at start-up (after the plan accepted them).
        loaded = compiled(loaded, settings, moves=plan is not None and not plan.resident)
    engines: list[Engine] = []
    disk = _shared_disk_cache(settings, resolver, loaded, engines)
    for own, lp in zip(own_settings, loaded, strict=True):
        engines.append(_engine(own, lp, plan, resolver, disk))
    pools = Pools(engines, resolver, Residency(device, plan.room if plan is not None else None))
    _log_residency(pools)
    return pools


def _log_storage(loaded: Sequence[LoadedPipeline], first: MemoryPlan | None, options: PlanOptions) -> None:
    why = "the memory plan's choice" if first is not None else "no memory plan before loading"
    for lp in loaded:
        native = str(lp.dtype).removeprefix("torch.")
        branched = f"{lp.storage} with LoRA branches of rank {lp.branch_rank}"
        stored = branched if lp.storage in BRANCHED else native
        logger.info(
            "pool %s: denoiser in %s (QUANTIZE=%s, %s)",
            lp.base_model_id,
            stored,
            options.quantize_of(lp.base_model_id),
            why,
        )


def _log_residency(pools: Pools) -> None:
    for memory_of in pools.residency_snapshot():
        logger.info(
            "pool %s: %.2f GiB, %s",
            memory_of.name,
            memory_of.nbytes / 2**30,
            "on the device" if memory_of.resident else "waiting in host RAM",
        )


def _shared_disk_cache(
    settings: Settings, resolver: AdapterResolver, loaded: Sequence[LoadedPipeline], engines: Sequence[Engine]
) -> DiskCache | None:
    """The pools' one Hub-cache pruner (None without a Hub or Civitai folder); `engines` fills in after it."""
    if not (resolver.uses_hub or resolver.civitai_dir is not None):
        return None
    keep = {r for p in settings.pool_settings for r in (p.model_id, p.base_model_id)} | {lp.model_id for lp in loaded}
    return DiskCache(
        settings.disk_cache_bytes,
        cache_dir=resolver.cache_dir,
        # The budget is for LoRAs: the served models' own repos are never pruned.
        keep_repos=keep | {settings.vae_id or ""},
        civitai_dir=resolver.civitai_dir,
        download_timeout_s=settings.hub_timeout_s,
        in_use=lambda: set[AdapterKey]().union(*(engine.adapters_in_use() for engine in engines)),
    )


def _engine(
    own: Settings, lp: LoadedPipeline, plan: MemoryPlan | None, resolver: AdapterResolver, disk: DiskCache | None
) -> Engine:
    """One pool's engine, its pristine store (and host RAM for it) as the memory plan placed them, its `QUANTIZE`
    resolved to the storage its denoiser loaded in (fp8 or off)."""
    host_pristine = None
    quantize = planned_quantize(lp.storage)
    # A GGUF pool's storage is its file's (`Settings.gguf`), which no QUANTIZE value names.
    own = own.replace(quantize=quantize) if quantize != "gguf" else own
    if plan is not None:
        placement = plan.placement(lp.base_model_id)
        own = own.replace(pristine_store=placement.pristine_store)
        if placement.pristine_store == "cpu" and plan.host_budget is not None:
            host_pristine = placement.host_pristine
    return Engine(lp, own, resolver, disk_cache=disk, host_pristine=host_pristine)
