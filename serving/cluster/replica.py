"""One pool's replica on Ray Serve: the Space's engine on one device, its adapter sets multiplexed by Serve.

Every request goes through the replica's own `LocalBackend`, as on the Space; nothing here calls the swap.
Serve's multiplexed model id is a request's adapter set; each id Serve holds is an `AdapterPin` leasing the set's
prepared adapters in the engine's cache, released when Serve evicts it, so the engine's cache and Serve's LRU
hold the same adapters. The replica reports its `SetBook` (`serving.cluster.stats`) as its routing stats and
runs torch on `CLUSTER_CPU_THREADS` threads. Details: docs/internals.md, "serving/cluster/replica.py".
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.constants import HF_HUB_CACHE

from engine.errors import SwitchboardError
from engine.formats.adapters import AdapterKey
from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine
from engine.pools.pools import lora_origin, pool_info
from engine.pools.routing import LoraOrigin, PoolInfo
from engine.prepare.civitai import civitai_files
from engine.prepare.keys import adapter_key
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateResult
from engine.settings import Settings
from lora_catalog.hub import HubSource
from serving.backends.local import LocalBackend
from serving.cluster.stats import SetBook
from serving.cluster.wire import WIRE, Answer, encode_png, request_from_json, result_to_json, spec_from_json
from serving.errors import json_error
from serving.http.api import encode_image, result_headers
from serving.recipes import with_recipes

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
        self._engine = Engine(loaded, settings, resolver)
        self._recipes = settings.recipes
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

    async def generate(self, document: dict, media_type: str) -> Answer:
        """Generate one request; errors of the tree become their JSON answer, anything else propagates.

        Serve cancels the call when the caller goes away: the request leaves the queue or stops at its next step.
        """
        from ray import serve

        set_id = serve.get_multiplexed_model_id()
        self._book.started(set_id)
        result = None
        try:
            request = request_from_json(document)
            pin = await self._pin(set_id) if set_id else None
            result = await self._backend.generate(request)
        except SwitchboardError as e:
            # The very bytes the Space answers with.
            error = json_error(e)
            return Answer(error.status_code, WIRE, bytes(error.body))
        finally:
            self._book.finished(set_id, result)
        if pin is not None:
            # The set as this request resolved it (a revision that moved swaps the old keys out).
            pin.hold(lease_keys(result))
        if media_type != WIRE and self._recipes:
            # `POST /` straight to the cluster: its image carries its recipe as the Space's does (on the wire the
            # front end's handlers add it).
            result = with_recipes(result)
        return await asyncio.to_thread(self._answer, result, media_type)

    def _answer(self, result: GenerateResult, media_type: str) -> Answer:
        headers = {**result_headers(result), "X-Replica": self._replica}
        if media_type == WIRE:
            more = [encode_png(image) for image in result.more_images]
            body = _json({"image": encode_png(result.image), "more_images": more, "result": result_to_json(result)})
        else:
            body = encode_image(result.image, media_type)
        return Answer(200, media_type, body, tuple(headers.items()))

    async def describe(self, what: str, document: dict) -> Answer:
        """The Space's other backend calls, as JSON: `info` (this pool as served), `status`, `check` (one LoRA)."""
        try:
            if what == "check":
                found: object = await self._backend.check(spec_from_json(document))
            elif what == "status":
                found = (await self._backend.status())[0].engine
            else:
                found = self._backend.pools()[0]
        except SwitchboardError as e:
            error = json_error(e)
            return Answer(error.status_code, WIRE, bytes(error.body))
        return Answer(200, WIRE, _json(_plain(found)))

    async def record_routing_stats(self) -> dict[str, object]:
        """Serve's routing stats (every CLUSTER_STATS_PERIOD_S): what our router reads (`serving.cluster.stats`)."""
        return self._book.report()

    async def info(self) -> PoolInfo:
        """What the ingress routes by: this pool's base, family and widths."""
        return pool_info(self._engine)

    async def origin(self, document: dict) -> LoraOrigin | Answer:
        """What one LoRA says of its base (card, metadata, shapes), for the ingress's routing; or its error."""
        try:
            spec = spec_from_json(document)
            resolver = self._engine.resolver
            disk = self._engine.disk_cache
            return await asyncio.to_thread(lambda: lora_origin(resolver, resolver.locate(spec), disk))
        except SwitchboardError as e:
            error = json_error(e)
            return Answer(error.status_code, WIRE, bytes(error.body))

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


def _plain(value: object) -> object:
    """Dataclasses as JSON-ready dicts (asdict recurses into AdapterKey and ModelDefaults too)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _json(document: object) -> bytes:
    return json.dumps(document).encode()
