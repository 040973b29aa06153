"""One pool's replica on Ray Serve: the Space's engine on one device, its adapter sets multiplexed by Serve.

Every request goes through the replica's own `LocalBackend`, as on the Space; nothing here calls the swap. Its
methods take and return the engine's own values, and raise the one tree's errors (Serve carries them to the front
end's `ServeBackend`, which is the only caller).
Serve's multiplexed model id is a request's adapter set; each id Serve holds is an `AdapterPin` leasing the set's
prepared adapters in the engine's cache, released when Serve evicts it, so the engine's cache and Serve's LRU
hold the same adapters. The replica reports its `SetBook` (`serving.cluster.stats`) as its routing stats and
runs torch on `CLUSTER_CPU_THREADS` threads. Details: docs/internals.md, "serving/cluster/replica.py".
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.constants import HF_HUB_CACHE

from engine.compare import CompareRequest, CompareResult
from engine.formats.adapters import AdapterKey
from engine.outcomes import EngineStatus, LoraCheck, ServedPool
from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine
from engine.pools.pools import lora_origin, pool_info
from engine.pools.routing import LoraOrigin, PoolInfo
from engine.prepare.civitai import civitai_files
from engine.prepare.keys import adapter_key
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from engine.settings import Settings
from lora_catalog.hub import HubSource
from serving.backends.local import LocalBackend
from serving.cluster.standin import VideoWaits, install_standin_gpu
from serving.cluster.stats import SetBook
from serving.video import packed

__all__ = ["AdapterPin", "PoolReplica", "lease_keys", "weights_digest"]

logger = logging.getLogger(__name__)


class AdapterPin:
    """Serve's model object for one adapter set: holds the set's adapters in the engine's cache until evicted."""

    def __init__(self, engine: Engine, set_id: str, book: SetBook) -> None:
        self._engine = engine
        self.set_id = set_id
        self._book = book
        self._lock = threading.Lock()
        self._keys: tuple[AdapterKey, ...] = ()

    def hold(self, keys: tuple[AdapterKey, ...]) -> None:
        """Hold these keys (the set as its request resolved it); a revision that moved swaps the old ones out."""
        with self._lock:
            if keys == self._keys:
                return
            old, self._keys = self._keys, keys
        self._engine.hold(keys)
        self._book.held(self.set_id)
        if old:
            self._engine.let_go(old)

    def __del__(self) -> None:
        # Serve calls this on eviction, and Python again at collection: only the first lets go.
        with self._lock:
            keys, self._keys = self._keys, ()
        if keys:
            logger.info("adapter set %s evicted by Serve; releasing %d adapters", self.set_id, len(keys))
            self._book.evicted(self.set_id)
            self._engine.let_go(keys)


class PoolReplica:
    """A deployment's replica: one engine over one base model (bound by `serving.cluster.app.build_app`)."""

    def __init__(self, settings: Settings, adapter_sets: int) -> None:
        # Imported here: the routing methods (`info`, `origin`) serve the ingress's tests without Ray.
        from ray import serve

        logging.basicConfig(level=settings.log_level_number)
        # Deliberately: Ray starts an actor that asks for no CPUs with one thread (OMP_NUM_THREADS=1).
        torch.set_num_threads(settings.cluster_cpu_threads or os.cpu_count() or 1)
        self._replica = serve.get_replica_context().replica_id.unique_id
        self._recipes = settings.recipes
        loaded = load_pipeline(settings, warm=not settings.zero_gpu)
        hub = HubSource(token=settings.hf_token, timeout_s=settings.hub_timeout_s)
        resolver = AdapterResolver(
            hub,
            local_dir=settings.local_lora_dir,
            token=settings.hf_token,
            max_bytes=settings.max_adapter_bytes,
            # A folder of its own under the Hub cache: this replica's disk, as on a machine of its own.
            cache_dir=Path(HF_HUB_CACHE) / f"replica-{self._replica}" if settings.cluster_own_hub_cache else None,
            timeout_s=settings.hub_timeout_s,
            civitai=civitai_files(settings),
        )
        if settings.cluster_standin_gpu_s:
            # For measuring the cluster on shared CPUs as one GPU per replica (bench.fleet --real).
            video = VideoWaits(settings.cluster_standin_video_step_s, settings.cluster_standin_video_chunk_s)
            install_standin_gpu(
                loaded.pipe,
                settings.cluster_standin_gpu_s,
                family=loaded.family,
                video=video if video.step_s else None,
            )
        self._engine = Engine(loaded, settings, resolver)
        self._backend = LocalBackend.of(self._engine)
        # What this replica holds, loads, has on disk and measured: its routing stats for our router.
        self._book = SetBook()

        async def pin(set_id: str) -> AdapterPin:
            return AdapterPin(self._engine, set_id, self._book)

        # Wired here, not as a decorated method, so the capacity is a setting; Serve detects it on the instance.
        self._pin: Callable[[str], Awaitable[AdapterPin]] = serve.multiplexed(max_num_models_per_replica=adapter_sets)(
            pin
        )
        logger.info(
            "replica %s serves %s with %d adapter sets on %d torch threads",
            self._replica,
            settings.model_id,
            adapter_sets,
            torch.get_num_threads(),
        )

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one request on this replica's `LocalBackend`; the tree's errors are raised to the caller (Serve
        carries them to `serving.backends.serve`, which maps them). Serve cancels the call when the caller goes
        away: the request leaves the queue or stops at its next step."""
        from ray import serve

        set_id = serve.get_multiplexed_model_id()
        self._book.started(set_id)
        result = None
        try:
            pin = await self._pin(set_id) if set_id else None
            result = await self._backend.generate(request)
        finally:
            self._book.finished(set_id, result)
        if pin is not None:
            # The set as this request resolved it (a revision that moved swaps the old keys out).
            pin.hold(lease_keys(result))
        # A video leaves as the MP4 every door answers (made once, here, with this replica's RECIPES), not frames.
        sent = await asyncio.to_thread(packed, result, self._recipes)
        return dataclasses.replace(sent, served_by=self._replica)

    async def compare(self, request: CompareRequest) -> CompareResult:
        """A comparison grid's cells, in one queue turn on this replica."""
        return await self._backend.compare(request)

    async def describe(self) -> tuple[ServedPool, PoolInfo]:
        """This pool as served (its defaults) and what routing needs of it (base, family, widths): asked once, by
        the front end as it deploys (`serving.backends.serve.ServeBackend.connect`)."""
        return self._backend.pools()[0], pool_info(self._engine)

    async def check(self, spec: LoraSpec) -> LoraCheck:
        return await self._backend.check(spec)

    async def prefetch(self, spec: LoraSpec) -> None:
        await self._backend.prefetch(spec)

    async def status(self) -> EngineStatus:
        return (await self._backend.status())[0].engine

    async def record_routing_stats(self) -> dict[str, object]:
        """Serve's routing stats (every CLUSTER_STATS_PERIOD_S): what our router reads (`serving.cluster.stats`)."""
        return self._book.report()

    async def origin(self, spec: LoraSpec) -> LoraOrigin:
        """What one LoRA says of its base (card, metadata, shapes), for the front end's routing."""
        resolver = self._engine.resolver
        disk = self._engine.disk_cache
        return await asyncio.to_thread(lambda: lora_origin(resolver, resolver.locate(spec), disk))

    async def weights(self) -> tuple[str, str, tuple[str, ...]]:
        """(replica id, SHA-256 of every weight with the base restored, adapters cached): for the tests."""
        return await asyncio.to_thread(self._weights)

    def _weights(self) -> tuple[str, str, tuple[str, ...]]:
        self._engine.restore_base_weights()  # under the engine's lock; it keeps serving, the next request fuses its set
        cached = tuple(str(c.key) for c in self._engine.status().cached)
        return self._replica, weights_digest(self._engine.loaded.pipe), cached


def weights_digest(pipe: Any) -> str:
    """SHA-256 over every weight's name and bytes of the pipeline's models (its family's denoiser, text encoders
    and VAE): equal digests are bit-exact weights."""
    digest = hashlib.sha256()
    models = {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    for name in sorted(models):
        for key, value in sorted(models[name].state_dict().items()):
            digest.update(f"{name}.".encode())
            digest.update(key.encode())
            digest.update(value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def lease_keys(result: GenerateResult) -> tuple[AdapterKey, ...]:
    """The cache keys of the adapters a result used, made as the engine made them (`engine.prepare.keys`): what
    a replica's `AdapterPin` holds."""
    return tuple(adapter_key(use.ref, use.revision, use.weight_name) for use in result.adapters)
