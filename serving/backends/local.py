"""`GpuRunner`: the one way the UI, `gradio_client` and the HTTP endpoint generate.

Each request is first routed to its pool (`engine.pools.pools`: the pool its LoRAs were made for, else the base
it names, else the default), then queued on that pool's engine scheduler (one queue, one limit, one position for every
transport), prepared (resolved, downloaded, converted) on its pool outside the `@spaces.GPU` function,
and run inside it once admitted, so on ZeroGPU the borrowed GPU time is spent on swapping and inference
only; the pool's pipeline is moved onto the device first when it waits in host RAM. The async path
(`complete`) waits on the scheduler without holding a thread; only the admitted request runs in one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import anyio
import spaces

from engine.caches.worker import GpuOutcome, WorkerCache, WorkerView
from engine.compare import CompareCell, CompareLimits, CompareRequest, CompareResult, plan_cells, prepare_cells
from engine.errors import GenerationError
from engine.pools.engine import Engine, PreparedRequest, Preview
from engine.pools.pools import Pool, Pools
from engine.pools.scheduler import QueueView, Ticket
from engine.requests import GenerateRequest, GenerateResult, LoraSpec

__all__ = ["GpuRunner", "PoolTicket"]

logger = logging.getLogger(__name__)

# ZeroGPU bills the declared duration; SDXL at 1024² runs roughly 2-3 steps a second on the GPUs it lends.
_GPU_BASE_S = 10
_GPU_S_PER_MEGAPIXEL_STEP = 0.5
_GPU_MAX_S = 120

Progress = Callable[[int, int], None]
CellProgress = Callable[[int, int, int], None]
T = TypeVar("T")


@dataclass(frozen=True)
class PoolTicket:
    """A request's place in the queue of the pool it was routed to."""

    pool: Pool
    ticket: Ticket[PreparedRequest]


class GpuRunner:
    """Route a request to its pool, queue it on that pool's scheduler, prepare it off the GPU's path, swap and
    generate inside it."""

    def __init__(
        self, target: Engine | Pools, *, zero_gpu: bool = False, gpu: Callable[..., Callable] = spaces.GPU
    ) -> None:
        self.pools = target if isinstance(target, Pools) else Pools.single(target)
        # The default pool's engine: its defaults, settings and events stand for the Space's.
        self.engine = self.pools.default.engine
        self._zero_gpu = zero_gpu
        # On ZeroGPU: the main process's view of the worker's adapters, and the worker's own cache (its copy
        # of this object lives in the forked worker; the main process never fills it).
        self._view = WorkerView()
        self.worker_cache = WorkerCache(self.engine.settings.device_cache_bytes)
        # A no-op off ZeroGPU; on it, the wrapped call runs in a forked worker that holds the GPU.
        self._run_on_gpu = gpu(self._run_shipped if zero_gpu else self._run, duration=_gpu_duration)
        self._compare_on_gpu = gpu(self._run_many, duration=_gpu_duration_many)

    def generate(
        self,
        request: GenerateRequest,
        *,
        base: str = "",
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        """Route, queue, wait and run, blocking this thread (scripts, tests; the transports use `complete`).

        `base` names a served base repo id for a request without a LoRA ("" for the default pool)."""
        pool = self.pools.route(request, base).pool
        with pool.engine.scheduler.slot(request, cancel) as prepared:
            return self._call_gpu(pool, prepared, progress, cancel, preview)

    def compare(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        progress: CellProgress | None = None,
        cancel: threading.Event | None = None,
    ) -> CompareResult:
        """A comparison grid's cells: planned and prepared on their pool, then run in one scheduler slot (one
        GPU call). Every LoRA of a comparison must belong to one pool."""
        started = time.perf_counter()
        pool, cells = self._plan_compare(request, base)
        # The first cell's request takes the queue turn; every cell runs inside it (no other request between).
        with prepare_cells(pool.engine, cells) as prepared, pool.engine.scheduler.slot(cells[0].request, cancel):
            results = self._compare_cells(pool, prepared, progress, cancel)
        return _compared(cells, results, started)

    async def compare_async(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        progress: CellProgress | None = None,
        cancel: threading.Event | None = None,
        on_queue: Callable[[QueueView], None] | None = None,
    ) -> CompareResult:
        """`compare` for the async handlers: the queue turn is awaited without holding a thread."""
        started = time.perf_counter()
        pool, cells = await anyio.to_thread.run_sync(self._plan_compare, request, base)
        with ExitStack() as stack:
            # Routing and preparing may download: in a worker thread; the leases end with the stack.
            enter = partial(stack.enter_context, prepare_cells(pool.engine, cells))
            prepared = await anyio.to_thread.run_sync(enter)
            ticket = PoolTicket(pool, pool.engine.scheduler.submit(cells[0].request))

            def run_cells() -> tuple[GenerateResult, ...]:
                pool.engine.scheduler.start(ticket.ticket)
                return self._compare_cells(pool, prepared, progress, cancel)

            results = await self._turn(ticket, on_queue, run_cells)
        return _compared(cells, results, started)

    def _plan_compare(self, request: CompareRequest, base: str) -> tuple[Pool, tuple[CompareCell, ...]]:
        loras = request.loras if isinstance(request.loras, tuple | list) else ()
        # Each LoRA once (a sweep names one several times): the cells' own checks come with `plan_cells`.
        unique = {
            (s.ref, s.revision, s.weight_name): s for s in loras if isinstance(s, LoraSpec) and isinstance(s.ref, str)
        }
        pool = self.pools.route(GenerateRequest(prompt="compare", loras=tuple(unique.values())), base).pool
        engine = pool.engine
        grid = CompareLimits(engine.settings.max_compare_cells, engine.settings.max_compare_steps)
        return pool, tuple(plan_cells(request, engine.defaults, engine.limits, grid))

    def _compare_cells(
        self,
        pool: Pool,
        prepared: tuple[PreparedRequest, ...],
        progress: CellProgress | None,
        cancel: threading.Event | None,
    ) -> tuple[GenerateResult, ...]:
        # On ZeroGPU the event cannot be pickled into the worker (nor would it reach it).
        return self._compare_on_gpu(prepared, progress, None if self._zero_gpu else cancel, pool.index)

    def submit(self, request: GenerateRequest, *, base: str = "") -> PoolTicket:
        """Route and queue `request` (EngineBusyError when its pool's queue is full); its preparation starts now.

        Routing may look a LoRA up on the Hub: async callers run this in a worker thread (`submit_async`)."""
        pool = self.pools.route(request, base).pool
        return PoolTicket(pool, pool.engine.scheduler.submit(request))

    async def submit_async(self, request: GenerateRequest, *, base: str = "") -> PoolTicket:
        """`submit` without blocking the event loop on routing (one pool: nothing to route, no thread)."""
        if len(self.pools.pools) == 1:
            return self.submit(request, base=base)
        return await anyio.to_thread.run_sync(partial(self.submit, request, base=base))

    def position(self, ticket: PoolTicket) -> QueueView:
        return ticket.pool.engine.scheduler.view(ticket.ticket)

    def cancel(self, ticket: PoolTicket) -> None:
        """Take a queued request out of its queue now (a running one stops with its cancel event)."""
        ticket.pool.engine.scheduler.cancel(ticket.ticket)

    async def complete(
        self,
        ticket: PoolTicket,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        on_queue: Callable[[QueueView], None] | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        """Wait for the slot on the event loop (no thread held), then swap and generate in a worker thread."""
        return await self._turn(ticket, on_queue, partial(self._run_admitted, ticket, progress, cancel, preview))

    async def _turn(self, ticket: PoolTicket, on_queue: Callable[[QueueView], None] | None, work: Callable[[], T]) -> T:
        """Await `ticket`'s turn on its pool (no thread held), run `work` in a worker thread, then leave the slot."""
        scheduler = ticket.pool.engine.scheduler
        try:
            await scheduler.wait_async(ticket.ticket, on_queue)
            return await anyio.to_thread.run_sync(work)
        finally:
            scheduler.finish(ticket.ticket)

    async def generate_async(
        self,
        request: GenerateRequest,
        *,
        base: str = "",
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        on_queue: Callable[[QueueView], None] | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        ticket = await self.submit_async(request, base=base)
        return await self.complete(ticket, progress=progress, cancel=cancel, on_queue=on_queue, preview=preview)

    def _run_admitted(
        self,
        ticket: PoolTicket,
        progress: Progress | None,
        cancel: threading.Event | None,
        preview: Preview | None,
    ) -> GenerateResult:
        prepared = ticket.pool.engine.scheduler.start(ticket.ticket)
        return self._call_gpu(ticket.pool, prepared, progress, cancel, preview)

    def _call_gpu(
        self,
        pool: Pool,
        prepared: PreparedRequest,
        progress: Progress | None,
        cancel: threading.Event | None,
        preview: Preview | None = None,
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

    def _run(
        self,
        prepared: PreparedRequest,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        preview: Preview | None = None,
        pool: int = 0,
    ) -> GenerateResult:
        return self.pools.run(self.pools.pools[pool], prepared, progress=progress, cancel=cancel, preview=preview)

    def _run_many(
        self,
        prepared: tuple[PreparedRequest, ...],
        progress: CellProgress | None = None,
        cancel: threading.Event | None = None,
        pool: int = 0,
    ) -> tuple[GenerateResult, ...]:
        return self.pools.run_many(self.pools.pools[pool], prepared, progress=progress, cancel=cancel)

    def _run_shipped(self, prepared: PreparedRequest, progress: Progress | None = None, pool: int = 0) -> GpuOutcome:
        """Inside the GPU worker: fill in adapters from its cache, then swap and generate."""
        received = self.worker_cache.receive(prepared)
        if isinstance(received, tuple):
            return GpuOutcome(None, received, self.worker_cache.held())
        result = self.pools.run(self.pools.pools[pool], received, progress=progress)
        return GpuOutcome(result, (), self.worker_cache.held())


def _compared(cells: tuple[CompareCell, ...], results: tuple[GenerateResult, ...], started: float) -> CompareResult:
    total_s = time.perf_counter() - started
    logger.info("compared %d cells in %.2f s", len(cells), total_s)
    return CompareResult(tuple(c.label for c in cells), results, int(cells[0].request.seed or 0), total_s)


def _gpu_duration(prepared: PreparedRequest, *args: object) -> int:
    request = prepared.request
    megapixels = (request.width or 1024) * (request.height or 1024) / 2**20
    return int(min(_GPU_MAX_S, _GPU_BASE_S + (request.steps or 25) * megapixels * _GPU_S_PER_MEGAPIXEL_STEP))


def _gpu_duration_many(prepared: tuple[PreparedRequest, ...], *args: object) -> int:
    return min(_GPU_MAX_S, sum(_gpu_duration(one) for one in prepared))
