"""`ServeBackend`: the `Backend` operations over a Ray Serve application, one deployment handle per pool.

The cluster's front end (`serving.cluster.ingress`) serves `Handlers(ServeBackend(...))`: the Space's own UI,
named API, `POST /` and metrics. The cluster adds only the choice of replica (Serve's router: ours,
`serving.cluster.router`, or its multiplexed one), by the request's adapter set. Each pool describes itself once,
as the front end deploys (`connect`): its defaults, base, family and widths; nothing asks it again. A request is
checked here as its pool checks it (`normalise_request` with the pool's defaults: a bad one is refused without a
replica, and its seed is drawn once, so a retry repeats its image), routed as in one process
(`engine.pools.routing`; a LoRA's origin asked of a default-pool replica and kept `_ORIGIN_TTL_S`), then sent.
`_call` is the one place wire failures map: a replica that died is tried once more, then BackendUnavailableError
(503); a replica's error is raised as the tree's own. No Ray import (`serving.cluster.app` passes Ray's failure
classes in), so it is tested with stand-in handles. No progress or previews: the result comes whole.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from cachetools import TTLCache

from engine.compare import MAX_COMPARE_LORAS, CompareRequest, CompareResult
from engine.errors import BackendUnavailableError
from engine.events import EngineEvents, EngineObserver
from engine.normalise import normalise_loras, normalise_request
from engine.outcomes import LoraCheck, PoolStatus, Preview, Progress, ServedPool
from engine.pools.routing import PoolInfo, described_pick, named_pool, routed
from engine.requests import GenerateRequest, GenerateResult, Limits, LoraSpec
from serving.backends import CellProgress, OnQueue
from serving.cluster.wire import adapter_set_id
from serving.video import checked_mp4

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from engine.settings import Settings

__all__ = ["ServeBackend", "ServePool"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A replica that dies mid-request is replaced by Serve; the request is sent once more, to a live replica.
_ATTEMPTS = 2
# Routing decisions kept, by LoRA reference (ref, revision, file), for as long as the catalogue trusts Hub
# metadata: a revision left unnamed is a branch, which may move to a commit made for another base.
_ORIGINS = 1024
_ORIGIN_TTL_S = 600.0


@dataclass(frozen=True)
class ServePool:
    """One pool of the cluster: how it is served, what routing needs of it, and its deployment."""

    served: ServedPool
    info: PoolInfo
    handle: DeploymentHandle


class ServeBackend:
    """A Ray Serve application's pools behind the `Backend` operations (see the module docstring)."""

    def __init__(
        self, pools: Sequence[ServePool], settings: Settings, *, retry_on: tuple[type[BaseException], ...] = ()
    ) -> None:
        """`retry_on`: the errors of a replica that died or is unavailable (Ray's, from `serving.cluster.app`)."""
        self._pools = tuple(pools)
        self._limits = Limits.of(settings)
        self._retry_on = retry_on
        # Metrics count this front end's requests by transport; the replicas' engines report their own timings.
        self.events = EngineEvents()
        # The front end's one event loop is their only user.
        self._origins: TTLCache[tuple[str, str | None, str | None], tuple[int | None, str]] = TTLCache(
            maxsize=_ORIGINS, ttl=_ORIGIN_TTL_S
        )

    @classmethod
    async def connect(
        cls,
        handles: Sequence[DeploymentHandle],
        settings: Settings,
        *,
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> ServeBackend:
        """The backend over these pools' deployments (the default first), each described once, now: as the
        front end deploys, beside the pools' first replicas."""
        described = await asyncio.gather(
            *(_call(f"pool {index}", handle.describe.remote, retry_on) for index, handle in enumerate(handles))
        )
        pools = [
            ServePool(dataclasses.replace(served, default=index == 0), info, handle)
            for index, ((served, info), handle) in enumerate(zip(described, handles, strict=True))
        ]
        logger.info("serving %s on the cluster", ", ".join(p.served.base_model_id for p in pools))
        return cls(pools, settings, retry_on=retry_on)

    def pools(self) -> tuple[ServedPool, ...]:
        return tuple(p.served for p in self._pools)

    def subscribe(self, observer: EngineObserver) -> None:
        """How this front end's requests ended: the engines' own events stay on the replicas."""
        self.events.subscribe(observer)

    async def generate(
        self,
        request: GenerateRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: Progress | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        pool = await self._route(request.loras, base)
        checked = normalise_request(request, pool.served.defaults, self._limits)
        # Sent with the seed drawn in the check: a retry on another replica repeats the image.
        sent = dataclasses.replace(request, seed=checked.seed)
        set_id = adapter_set_id(sent)
        handle = pool.handle.options(multiplexed_model_id=set_id) if set_id else pool.handle
        result: GenerateResult = await self._call(pool, lambda: handle.generate.remote(sent))
        if progress is not None:
            progress(checked.steps, checked.steps)
        # A video came as its replica's MP4 (`serving.video.packed`): checked off the loop, passed on undecoded.
        return await asyncio.to_thread(checked_mp4, result)

    async def compare(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: CellProgress | None = None,
    ) -> CompareResult:
        """On the LoRAs' pool, in one queue turn of one replica (which plans and checks the cells)."""
        loras = request.loras if isinstance(request.loras, tuple | list) else ()
        unique = {(s.ref, s.revision, s.weight_name): s for s in loras if isinstance(s, LoraSpec)}
        pool = await self._route(tuple(unique.values()), base)
        result: CompareResult = await self._call(pool, lambda: pool.handle.compare.remote(request))
        return result

    async def check(self, spec: LoraSpec) -> LoraCheck:
        pool = await self._route((spec,), "")
        check: LoraCheck = await self._call(pool, lambda: pool.handle.check.remote(spec))
        return check

    async def prefetch(self, spec: LoraSpec) -> None:
        pool = await self._route((spec,), "")
        await self._call(pool, lambda: pool.handle.prefetch.remote(spec))

    async def status(self) -> tuple[PoolStatus, ...]:
        engines = await asyncio.gather(*(self._call(p, p.handle.status.remote) for p in self._pools))
        return tuple(
            PoolStatus(p.served.base_model_id, p.served.family, p.served.default, None, engine)
            for p, engine in zip(self._pools, engines, strict=True)
        )

    def close(self) -> None:
        """Nothing is held: Serve owns the handles' connections."""

    async def _route(self, loras: Sequence[LoraSpec], base: str) -> ServePool:
        """The pool as one process routes (`engine.pools.routing.routed`)."""
        served = self.pools()
        named = named_pool(served, base) if base.strip() else None
        if len(self._pools) == 1:
            return self._pools[0]
        specs = normalise_loras(tuple(loras), max(self._limits.max_loras, MAX_COMPARE_LORAS))
        choices = [(spec.ref, *await self._lora_pool(spec)) for spec in specs]
        index, reason = routed(served, named, choices)
        pool = self._pools[index]
        logger.info("route %s -> pool %s (%s)", [s.ref for s in specs] or "no LoRA", pool.served.base_model_id, reason)
        return pool

    async def _lora_pool(self, spec: LoraSpec) -> tuple[int | None, str]:
        key = (spec.ref, spec.revision, spec.weight_name)
        if key in self._origins:
            return self._origins[key]
        default = self._pools[0]
        origin = await self._call(default, lambda: default.handle.origin.remote(spec))
        decision = described_pick(f"LoRA {spec.ref!r}", origin, [p.info for p in self._pools])
        self._origins[key] = decision
        return decision

    async def _call(self, pool: ServePool, call: Callable[[], Awaitable[T]]) -> T:
        return await _call(pool.served.base_model_id, call, self._retry_on)


async def _call(label: str, call: Callable[[], Awaitable[T]], retry_on: tuple[type[BaseException], ...]) -> T:
    """A call to one of a pool's replicas, made once more if that replica died or was unavailable (Serve sends it
    to a live one); BackendUnavailableError (503) when the second fails too. What the replica raised is raised
    here as itself (Ray wraps it, keeping it as `cause`)."""
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return await call()
        except retry_on as e:
            logger.warning(
                "a replica of %s failed on try %d of %d (%s: %s)", label, attempt, _ATTEMPTS, type(e).__name__, e
            )
            failure = e
        except Exception as e:
            cause: Any = getattr(e, "cause", None)
            if isinstance(cause, Exception) and cause is not e:
                raise cause from None
            raise
    raise BackendUnavailableError(
        f"{_ATTEMPTS} replicas of {label} failed in turn on this request; try again shortly"
    ) from failure
