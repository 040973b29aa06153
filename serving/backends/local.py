"""`LocalBackend`: the pools of this process, the one way every transport generates here.

A request is routed to its pool (`engine.pools.pools.Pools.route`: the pool its LoRAs were made for, else the
base it names, else the default; on a thread when routing may read the Hub), then takes one turn of that pool's
scheduler (`Scheduler.turn`: queued, prepared off the GPU's path, admitted, left), and runs inside it through
the `@spaces.GPU` function (a no-op off ZeroGPU), in a worker thread, with the pool's pipeline on the device.
So on ZeroGPU the borrowed GPU time is spent on the swap and inference only. Waiting holds no thread; a
cancelled task leaves the queue, or stops the run at its next step (the slot is left once the run has stopped).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from typing import TypeVar

import anyio
import spaces

from engine.caches.worker import GpuOutcome, WorkerCache, WorkerView
from engine.compare import CompareCell, CompareLimits, CompareRequest, CompareResult, plan_cells, prepare_cells
from engine.errors import GenerationError
from engine.events import EngineEvents, EngineObserver
from engine.outcomes import LoraCheck, PoolStatus, PreparedRequest, Preview, Progress, ServedPool
from engine.pools.engine import Engine
from engine.pools.pools import Pool, Pools
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from serving.backends import CellProgress, OnQueue

__all__ = ["LocalBackend"]

logger = logging.getLogger(__name__)

# ZeroGPU bills the declared duration; SDXL at 1024² runs roughly 2-3 steps a second on the GPUs it lends.
_GPU_BASE_S = 10
_GPU_S_PER_MEGAPIXEL_STEP = 0.5
_GPU_MAX_S = 120

T = TypeVar("T")


class LocalBackend:
    """This process's pools behind the `Backend` operations (see the module docstring)."""

    def __init__(self, pools: Pools, *, zero_gpu: bool = False, gpu: Callable[..., Callable] = spaces.GPU) -> None:
        self._pools = pools
        # The default pool's engine reports how requests ended; the metrics count them there.
        self.events: EngineEvents = pools.default.engine.events
        self._zero_gpu = zero_gpu
        # On ZeroGPU: the main process's view of the worker's adapters, and the worker's own cache (its copy
        # of this object lives in the forked worker; the main process never fills it).
        self._view = WorkerView()
        self.worker_cache = WorkerCache(pools.default.engine.settings.device_cache_bytes)
        # A no-op off ZeroGPU; on it, the wrapped call runs in a forked worker that holds the GPU.
        self._run_on_gpu = gpu(self._run_shipped if zero_gpu else self._run, duration=_gpu_duration)
        self._compare_on_gpu = gpu(self._run_many, duration=_gpu_duration_many)

    @classmethod
    def of(cls, engine: Engine, **kwargs: object) -> LocalBackend:
        """A backend over one engine, always resident (the cluster's replicas, scripts and tests)."""
        return cls(Pools.single(engine), **kwargs)  # type: ignore[arg-type]

    @property
    def served(self) -> Pools:
        """The pools themselves (start-up wiring and the metrics watch their engines)."""
        return self._pools

    def pools(self) -> tuple[ServedPool, ...]:
        return self._pools.served()

    def subscribe(self, observer: EngineObserver) -> None:
        for pool in self._pools.pools:
            pool.engine.events.subscribe(observer)

    # -- the operations --------------------------------------------------------------------------

    async def generate(
        self,
        request: GenerateRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: Progress | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        pool = await self._route(request, base)
        async with pool.engine.scheduler.turn(request, on_queue) as prepared:
            return await _in_thread(partial(self._call_gpu, pool, prepared, progress, preview))

    async def compare(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: CellProgress | None = None,
    ) -> CompareResult:
        """Every cell planned and prepared on the LoRAs' pool, then run in one queue turn (one GPU call)."""
        started = time.perf_counter()
        pool, cells = await anyio.to_thread.run_sync(self._plan_compare, request, base)
        with ExitStack() as stack:
            # Preparing may download: in a worker thread; the leases end with the stack.
            prepared = await anyio.to_thread.run_sync(stack.enter_context, prepare_cells(pool.engine, cells))
            # The first cell's request takes the queue turn; every cell runs inside it (no other request between).
            async with pool.engine.scheduler.turn(cells[0].request, on_queue):
                results = await _in_thread(partial(self._compare_cells, pool, prepared, progress))
        total_s = time.perf_counter() - started
        logger.info("compared %d cells on %s in %.2f s", len(cells), pool.base_model_id, total_s)
        return CompareResult(tuple(c.label for c in cells), results, int(cells[0].request.seed or 0), total_s)

    async def check(self, spec: LoraSpec) -> LoraCheck:
        """Checked on the pool it belongs to (routing and preparing may download: in a worker thread)."""

        def check() -> LoraCheck:
            return self._pools.route(GenerateRequest(prompt="check", loras=(spec,))).pool.engine.check_lora(spec)

        return await anyio.to_thread.run_sync(check)

    async def prefetch(self, spec: LoraSpec) -> None:
        """Prepared on its pool's preparation threads; routing it runs on a worker thread first."""
        pool = await self._route(GenerateRequest(prompt="prefetch", loras=(spec,)), "")
        await asyncio.wrap_future(pool.engine.prefetch(spec))

    async def status(self) -> tuple[PoolStatus, ...]:
        return self._pools.status()

    def close(self) -> None:
        self._pools.close()

    # -- inside the turn -------------------------------------------------------------------------

    async def _route(self, request: GenerateRequest, base: str) -> Pool:
        if len(self._pools.pools) == 1:
            # Nothing to route (a named base is still checked): no thread.
            return self._pools.route(request, base).pool
        return (await anyio.to_thread.run_sync(self._pools.route, request, base)).pool

    def _plan_compare(self, request: CompareRequest, base: str) -> tuple[Pool, tuple[CompareCell, ...]]:
        loras = request.loras if isinstance(request.loras, tuple | list) else ()
        # Each LoRA once (a sweep names one several times): the cells' own checks come with `plan_cells`.
        unique = {
            (s.ref, s.revision, s.weight_name): s for s in loras if isinstance(s, LoraSpec) and isinstance(s.ref, str)
        }
        pool = self._pools.route(GenerateRequest(prompt="compare", loras=tuple(unique.values())), base).pool
        engine = pool.engine
        grid = CompareLimits(engine.settings.max_compare_cells, engine.settings.max_compare_steps)
        return pool, tuple(plan_cells(request, engine.defaults, engine.limits, grid))

    def _compare_cells(
        self,
        pool: Pool,
        prepared: tuple[PreparedRequest, ...],
        progress: CellProgress | None,
        cancel: threading.Event,
    ) -> tuple[GenerateResult, ...]:
        # On ZeroGPU the event cannot be pickled into the worker (nor would it reach it).
        return self._compare_on_gpu(prepared, progress, None if self._zero_gpu else cancel, pool.index)

    def _call_gpu(
        self,
        pool: Pool,
        prepared: PreparedRequest,
        progress: Progress | None,
        preview: Preview | None,
        cancel: threading.Event,
    ) -> GenerateResult:
        if self._zero_gpu:
            # No previews there: a callback from the ZeroGPU worker would not reach this process.
            result = self._generate_shipped(prepared, progress, pool.index)
            # The worker's events reached the worker's copy of the observers; report its timings here instead
            # (its time waiting for the engine's lock is not known out here).
            if result.swapped:
                pool.engine.events.swapped(result.timings.apply)
            pool.engine.events.inferred(result.timings.inference)
            return result
        # The pool goes by its index: on ZeroGPU the arguments are pickled, and an engine must not be.
        return self._run_on_gpu(prepared, progress, cancel, preview, pool.index)

    def _generate_shipped(self, prepared: PreparedRequest, progress: Progress | None, pool: int) -> GenerateResult:
        # Arguments are pickled into the ZeroGPU worker; an Event cannot be, and would not reach it anyway.
        outcome = self._run_on_gpu(self._view.ship(prepared), progress, pool)
        if outcome.result is None:
            # The worker lacked adapters it was thought to hold (a new worker): once more, with tensors.
            outcome = self._run_on_gpu(self._view.ship(prepared, full=True), progress, pool)
        self._view.learn(outcome)
        if outcome.result is None:
            raise GenerationError(f"the GPU worker could not receive {', '.join(map(str, outcome.missing))}")
        return outcome.result

    # -- inside the GPU function (on ZeroGPU: in its worker process) ------------------------------

    def _run(
        self,
        prepared: PreparedRequest,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        preview: Preview | None = None,
        pool: int = 0,
    ) -> GenerateResult:
        chosen = self._pools.pools[pool]
        with self._pools.on_device(chosen):
            return chosen.engine.run(prepared, progress=progress, cancel=cancel, preview=preview)

    def _run_many(
        self,
        prepared: tuple[PreparedRequest, ...],
        progress: CellProgress | None = None,
        cancel: threading.Event | None = None,
        pool: int = 0,
    ) -> tuple[GenerateResult, ...]:
        chosen = self._pools.pools[pool]
        with self._pools.on_device(chosen):
            return chosen.engine.run_many(prepared, progress=progress, cancel=cancel)

    def _run_shipped(self, prepared: PreparedRequest, progress: Progress | None = None, pool: int = 0) -> GpuOutcome:
        """Inside the GPU worker: fill in adapters from its cache, then swap and generate."""
        received = self.worker_cache.receive(prepared)
        if isinstance(received, tuple):
            return GpuOutcome(None, received, self.worker_cache.held())
        result = self._run(received, progress, pool=pool)
        return GpuOutcome(result, (), self.worker_cache.held())


async def _in_thread(work: Callable[[threading.Event], T]) -> T:
    """`work(cancel)` in a worker thread; cancelling the awaiting task sets `cancel` and waits for the work to
    stop before the cancellation goes on, so the caller's slot is never left while its run still holds the GPU."""
    cancel = threading.Event()
    running = asyncio.ensure_future(anyio.to_thread.run_sync(work, cancel))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        cancel.set()
        # Shielded: an anyio scope cancelled around the caller would cancel this wait again at once.
        with anyio.CancelScope(shield=True):
            try:
                await running
            except BaseException as e:  # the run's own end (usually GenerationCancelledError): the cancel wins
                logger.debug("a cancelled run ended with %s", type(e).__name__)
        raise


def _gpu_duration(prepared: PreparedRequest, *args: object) -> int:
    request = prepared.request
    # Several images are one batch: about as many times the pixels to denoise.
    megapixels = (request.width or 1024) * (request.height or 1024) * max(1, request.num_images) / 2**20
    return int(min(_GPU_MAX_S, _GPU_BASE_S + (request.steps or 25) * megapixels * _GPU_S_PER_MEGAPIXEL_STEP))


def _gpu_duration_many(prepared: tuple[PreparedRequest, ...], *args: object) -> int:
    return min(_GPU_MAX_S, sum(_gpu_duration(one) for one in prepared))
