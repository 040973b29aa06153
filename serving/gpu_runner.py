"""`GpuRunner`: the one way the UI, `gradio_client` and the HTTP endpoint generate.

Each request is queued on the engine's scheduler (one queue, one limit, one position for every
transport), prepared (resolved, downloaded, converted) on its pool outside the `@spaces.GPU` function,
and run inside it once admitted, so on ZeroGPU the borrowed GPU time is spent on swapping and inference
only. The async path (`complete`) waits on the scheduler without holding a thread; only the admitted
request runs in one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import anyio
import spaces

from engine.compare import CompareLimits, CompareRequest, CompareResult, plan_cells, prepare_cells
from engine.errors import GenerationError
from engine.requests import GenerateRequest, GenerateResult
from engine.scheduler import QueueView, Ticket
from engine.service import Engine, PreparedRequest, Preview
from engine.worker_cache import GpuOutcome, WorkerCache, WorkerView

__all__ = ["GpuRunner"]

logger = logging.getLogger(__name__)

# ZeroGPU bills the declared duration; SDXL at 1024² runs roughly 2-3 steps a second on the GPUs it lends.
_GPU_BASE_S = 10
_GPU_S_PER_MEGAPIXEL_STEP = 0.5
_GPU_MAX_S = 120

Progress = Callable[[int, int], None]
CellProgress = Callable[[int, int, int], None]


class GpuRunner:
    """Queue a request on the engine's scheduler, prepare it off the GPU's path, swap and generate inside it."""

    def __init__(self, engine: Engine, *, zero_gpu: bool = False, gpu: Callable[..., Callable] = spaces.GPU) -> None:
        self.engine = engine
        self._zero_gpu = zero_gpu
        # On ZeroGPU: the main process's view of the worker's adapters, and the worker's own cache (its copy
        # of this object lives in the forked worker; the main process never fills it).
        self._view = WorkerView()
        self.worker_cache = WorkerCache(engine.settings.device_cache_bytes)
        # A no-op off ZeroGPU; on it, the wrapped call runs in a forked worker that holds the GPU.
        self._run_on_gpu = gpu(self._run_shipped if zero_gpu else self._run, duration=_gpu_duration)
        self._compare_on_gpu = gpu(self._run_many, duration=_gpu_duration_many)

    def generate(
        self,
        request: GenerateRequest,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        """Queue, wait and run, blocking this thread (scripts, tests; the transports use `complete`)."""
        with self.engine.scheduler.slot(request, cancel) as prepared:
            return self._call_gpu(prepared, progress, cancel, preview)

    def compare(
        self, request: CompareRequest, *, progress: CellProgress | None = None, cancel: threading.Event | None = None
    ) -> CompareResult:
        """A comparison grid's cells: planned and prepared, then run in one scheduler slot (one GPU call)."""
        settings = self.engine.settings
        grid = CompareLimits(settings.max_compare_cells, settings.max_compare_steps)
        cells = plan_cells(request, self.engine.defaults, self.engine.limits, grid)
        started = time.perf_counter()
        # The first cell's request takes the queue turn; every cell runs inside it (no other request between).
        with prepare_cells(self.engine, cells) as prepared, self.engine.scheduler.slot(cells[0].request, cancel):
            if self._zero_gpu:
                results = self._compare_on_gpu(prepared, progress)
            else:
                results = self._compare_on_gpu(prepared, progress, cancel)
        total_s = time.perf_counter() - started
        logger.info("compared %d cells in %.2f s", len(cells), total_s)
        return CompareResult(tuple(c.label for c in cells), results, int(cells[0].request.seed or 0), total_s)

    def submit(self, request: GenerateRequest) -> Ticket[PreparedRequest]:
        """Queue `request` (EngineBusyError when the queue is full); its preparation starts now."""
        return self.engine.scheduler.submit(request)

    def position(self, ticket: Ticket[PreparedRequest]) -> QueueView:
        return self.engine.scheduler.view(ticket)

    async def complete(
        self,
        ticket: Ticket[PreparedRequest],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        on_queue: Callable[[QueueView], None] | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        """Wait for the slot on the event loop (no thread held), then swap and generate in a worker thread."""
        scheduler = self.engine.scheduler
        try:
            await scheduler.wait_async(ticket, on_queue)
            return await anyio.to_thread.run_sync(self._run_admitted, ticket, progress, cancel, preview)
        finally:
            scheduler.finish(ticket)

    async def generate_async(
        self,
        request: GenerateRequest,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        on_queue: Callable[[QueueView], None] | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        return await self.complete(
            self.submit(request), progress=progress, cancel=cancel, on_queue=on_queue, preview=preview
        )

    def _run_admitted(
        self,
        ticket: Ticket[PreparedRequest],
        progress: Progress | None,
        cancel: threading.Event | None,
        preview: Preview | None,
    ) -> GenerateResult:
        return self._call_gpu(self.engine.scheduler.start(ticket), progress, cancel, preview)

    def _call_gpu(
        self,
        prepared: PreparedRequest,
        progress: Progress | None,
        cancel: threading.Event | None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        if self._zero_gpu:
            # No previews there: a callback from the ZeroGPU worker would not reach this process.
            result = self._generate_shipped(prepared, progress)
            # The worker's events reached the worker's copy of the observers; report its timings here instead
            # (its time waiting for the engine's lock is not known out here).
            if result.swapped:
                self.engine.events.swapped(result.timings.apply)
            self.engine.events.inferred(result.timings.inference)
            return result
        return self._run_on_gpu(prepared, progress, cancel, preview)

    def _generate_shipped(self, prepared: PreparedRequest, progress: Progress | None) -> GenerateResult:
        # Arguments are pickled into the ZeroGPU worker; an Event cannot be, and would not reach it anyway.
        outcome = self._run_on_gpu(self._view.ship(prepared), progress)
        if outcome.result is None:
            # The worker lacked adapters it was thought to hold (a new worker): once more, with tensors.
            outcome = self._run_on_gpu(self._view.ship(prepared, full=True), progress)
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
    ) -> GenerateResult:
        return self.engine.run(prepared, progress=progress, cancel=cancel, preview=preview)

    def _run_many(
        self,
        prepared: tuple[PreparedRequest, ...],
        progress: CellProgress | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[GenerateResult, ...]:
        return self.engine.run_many(prepared, progress=progress, cancel=cancel)

    def _run_shipped(self, prepared: PreparedRequest, progress: Progress | None = None) -> GpuOutcome:
        """Inside the GPU worker: fill in adapters from its cache, then swap and generate."""
        received = self.worker_cache.receive(prepared)
        if isinstance(received, tuple):
            return GpuOutcome(None, received, self.worker_cache.held())
        result = self.engine.run(received, progress=progress)
        return GpuOutcome(result, (), self.worker_cache.held())


def _gpu_duration(prepared: PreparedRequest, *args: object) -> int:
    request = prepared.request
    megapixels = (request.width or 1024) * (request.height or 1024) / 2**20
    return int(min(_GPU_MAX_S, _GPU_BASE_S + (request.steps or 25) * megapixels * _GPU_S_PER_MEGAPIXEL_STEP))


def _gpu_duration_many(prepared: tuple[PreparedRequest, ...], *args: object) -> int:
    return min(_GPU_MAX_S, sum(_gpu_duration(one) for one in prepared))
