"""`LocalBackend`: the pools of this process, the one way every transport generates here.

A request is routed to its pool (`engine.pools.pools.Pools.route`: the pool its LoRAs were made for, else the
base it names, else the default; on a thread when routing may read the Hub), then takes one turn of that pool's
scheduler (`Scheduler.turn`: queued, prepared off the GPU's path, admitted, left), and runs inside it through
the `@spaces.GPU` function (a no-op off ZeroGPU), on the pool's own thread, with the pool's pipeline on the device.
So on ZeroGPU the borrowed GPU time is spent on the swap and inference only. Waiting holds no thread; a
cancelled task leaves the queue, or stops the run at its next step (the slot is left once the run has stopped),
on ZeroGPU too, where the GPU call is a generator of steps the main process closes (`serving.backends.zerogpu`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TypeVar

import anyio
import spaces

from engine.caches.worker import GpuOutcome, WorkerCache, WorkerView
from engine.compare import CompareCell, CompareLimits, CompareRequest, CompareResult, open_cells, plan_cells
from engine.errors import GenerationError
from engine.events import EngineEvents, EngineObserver
from engine.outcomes import LoraCheck, PoolStatus, PreparedRequest, Preview, Progress, ServedPool
from engine.pipeline.aot import AotDenoiser, AotPackage
from engine.pipeline.loading import package_denoiser
from engine.pools.engine import Engine
from engine.pools.pools import Pool, Pools
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from serving.backends import CellProgress, OnQueue
from serving.backends.zerogpu import Finished, Step, drive, gpu_errors, run_in_steps

__all__ = ["LocalBackend"]

logger = logging.getLogger(__name__)

# ZeroGPU bills the declared duration; SDXL at 1024² runs roughly 2-3 steps a second on the GPUs it lends.
_GPU_BASE_S = 10
_GPU_S_PER_MEGAPIXEL_STEP = 0.5
_GPU_MAX_S = 120
# Compiling every pool's denoiser ahead of time at start-up: ZeroGPU's own AoT guide gives that call 1500 s.
_GPU_COMPILE_S = 1500

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
        # The admitted run goes on a thread of its pool's own, never one of anyio's shared threads: requests still
        # waiting (routing, checks, Gradio's sync handlers) may hold every one of those, and the slot would sit
        # idle. One each suffices: a pool's slot holds one run at a time, left only once that run has stopped.
        self._gpu_threads = tuple(
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gpu-{pool.index}")
            for pool in pools.pools
        )
        # A request's check (a scheduler class is built on its first use: 10-250 ms) has threads of its own too,
        # for the same reason: a request must not wait for one of anyio's shared threads to be refused or queued.
        self._check_threads = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="check")
        # A no-op off ZeroGPU; on it, the wrapped call runs in a forked worker that holds the GPU, as a generator
        # of steps so that a cancel reaches it (serving.backends.zerogpu).
        if zero_gpu:
            self._run_on_gpu = gpu(self._run_shipped, duration=_gpu_duration)
            self._compare_on_gpu = gpu(self._run_many_shipped, duration=_gpu_duration_many)
        else:
            self._run_on_gpu = gpu(self._run, duration=_gpu_duration)
            self._compare_on_gpu = gpu(self._run_many, duration=_gpu_duration_many)
        self._package_on_gpu = gpu(self._package, duration=_GPU_COMPILE_S)

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
        # Refused here, never queued: what the pool cannot run (its scheduler options among it) is a 400 before
        # the request takes a place. Checked once: the checked request is what is queued and prepared.
        checked = await asyncio.get_running_loop().run_in_executor(
            self._check_threads, contextvars.copy_context().run, pool.engine.check, request
        )
        async with pool.engine.scheduler.turn(checked, on_queue) as prepared:
            return await _in_thread(
                self._gpu_threads[pool.index], partial(self._call_gpu, pool, prepared, progress, preview)
            )

    async def compare(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: CellProgress | None = None,
    ) -> CompareResult:
        """Every cell planned on the LoRAs' pool, then queued as one ticket (a full queue refuses the grid before
        anything is downloaded), prepared on the scheduler's bounded threads, and run in that one queue turn (one
        GPU call; no other request between the cells). Cancelling the task leaves the queue, or stops the grid at
        its next step."""
        started = time.perf_counter()
        pool, cells = await self._plan_compare(request, base)
        engine = pool.engine
        grid = partial(open_cells, engine, cells)
        async with engine.scheduler.turn(cells[0].request, on_queue, prepare=grid) as prepared:
            results = await _in_thread(
                self._gpu_threads[pool.index], partial(self._compare_cells, pool, prepared, progress)
            )
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

    def close(self, *, pools: bool = True) -> None:
        """Stop its threads, and (with `pools`) put every pool's base weights back: not where a backend over the
        same engines took its place (`serving.backends.growing`), which closes them."""
        if pools:
            self._pools.close()
        for thread in (*self._gpu_threads, self._check_threads):
            thread.shutdown(wait=False, cancel_futures=True)

    def compile_ahead(self, mode: str, *, sizes: Sequence[tuple[int, int]] | None = None) -> None:
        """ZeroGPU with COMPILE: each pool's denoiser compiled ahead of time in one GPU call at start-up.

        The packages come back here (the main process has no GPU) and are installed on the denoiser, without the
        weights: each worker loads them at its first call and binds them to its own weight tensors
        (`engine.pipeline.aot`). `sizes` (default: each pool's presets) for tests.
        """
        for pool in self._pools.pools:
            started = time.perf_counter()
            packages = self._package_on_gpu(pool.index, mode, sizes)
            denoiser = pool.engine.loaded.denoiser
            if not isinstance(denoiser.__dict__.get("forward"), AotDenoiser):
                AotDenoiser.install(denoiser, packages, mode)
            logger.info(
                "pool %s: %d denoiser packages compiled ahead of time in %.1f s",
                pool.base_model_id,
                len(packages),
                time.perf_counter() - started,
            )

    # -- inside the turn -------------------------------------------------------------------------

    async def _route(self, request: GenerateRequest, base: str) -> Pool:
        if len(self._pools.pools) == 1:
            # Nothing to route (a named base is still checked): no thread.
            return self._pools.route(request, base).pool
        return (await anyio.to_thread.run_sync(self._pools.route, request, base)).pool

    async def _plan_compare(self, request: CompareRequest, base: str) -> tuple[Pool, tuple[CompareCell, ...]]:
        loras = request.loras if isinstance(request.loras, tuple | list) else ()
        # Each LoRA once (a sweep names one several times): the cells' own checks come with `plan_cells`.
        unique = {
            (s.ref, s.revision, s.weight_name): s for s in loras if isinstance(s, LoraSpec) and isinstance(s.ref, str)
        }
        pool = await self._route(GenerateRequest(prompt="compare", loras=tuple(unique.values())), base)
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
        if self._zero_gpu:
            # The event cannot be pickled into the worker: the steps come back, and closing them stops the run.
            with gpu_errors():
                return drive(self._compare_on_gpu(prepared, pool.index), progress, cancel)
        return self._compare_on_gpu(prepared, progress, cancel, pool.index)

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
            result = self._generate_shipped(prepared, progress, pool.index, cancel)
            # The worker's events reached the worker's copy of the observers; report its timings here instead
            # (its time waiting for the engine's lock is not known out here).
            if result.swapped:
                pool.engine.events.swapped(result.timings.apply)
            pool.engine.events.inferred(result.timings.inference)
            return result
        # The pool goes by its index: on ZeroGPU the arguments are pickled, and an engine must not be.
        return self._run_on_gpu(prepared, progress, cancel, preview, pool.index)

    def _generate_shipped(
        self, prepared: PreparedRequest, progress: Progress | None, pool: int, cancel: threading.Event
    ) -> GenerateResult:
        # Arguments are pickled into the ZeroGPU worker; an Event cannot be, and would not reach it anyway: the
        # worker's steps come back instead, and closing them when `cancel` is set stops the run there.
        with gpu_errors():
            outcome = drive(self._run_on_gpu(self._view.ship(prepared), pool), progress, cancel)
            if outcome.result is None:
                # The worker lacked adapters it was thought to hold (a new worker): once more, with tensors.
                outcome = drive(self._run_on_gpu(self._view.ship(prepared, full=True), pool), progress, cancel)
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

    def _package(self, pool: int, mode: str, sizes: Sequence[tuple[int, int]] | None = None) -> tuple[AotPackage, ...]:
        """Inside the GPU worker at start-up: the pool's denoiser packaged per shape, installed here too (spaces
        may keep this worker for the calls that follow, and it was forked before the main process installs)."""
        chosen = self._pools.pools[pool]
        with self._pools.on_device(chosen):
            loaded = chosen.engine.loaded
            packages = package_denoiser(loaded, mode, sizes=sizes)
            AotDenoiser.install(loaded.denoiser, packages, mode)
            return packages

    def _run_shipped(self, prepared: PreparedRequest, pool: int = 0) -> Iterator[Step | Finished[GpuOutcome]]:
        """Inside the GPU worker: fill in adapters from its cache, then swap and generate, a step at a time."""
        received = self.worker_cache.receive(prepared)
        if isinstance(received, tuple):
            yield Finished(GpuOutcome(None, received, self.worker_cache.held()))
            return

        def run(progress: Progress, cancel: threading.Event) -> GpuOutcome:
            result = self._run(received, progress, cancel, pool=pool)
            return GpuOutcome(result, (), self.worker_cache.held())

        yield from run_in_steps(run)

    def _run_many_shipped(
        self, prepared: tuple[PreparedRequest, ...], pool: int = 0
    ) -> Iterator[Step | Finished[tuple[GenerateResult, ...]]]:
        """Inside the GPU worker: a comparison's cells, a step at a time."""
        yield from run_in_steps(lambda progress, cancel: self._run_many(prepared, progress, cancel, pool))


async def _in_thread(thread: concurrent.futures.Executor, work: Callable[[threading.Event], T]) -> T:
    """`work(cancel)` on `thread`; cancelling the awaiting task sets `cancel` and waits for the work to stop
    before the cancellation goes on, so the caller's slot is never left while its run still holds the GPU."""
    cancel = threading.Event()
    # The caller's context goes along, as anyio's and asyncio's threads take it: Gradio's progress bar finds its
    # event through a context variable, and a run without it reports no steps.
    context = contextvars.copy_context()
    running = asyncio.get_running_loop().run_in_executor(thread, context.run, work, cancel)
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
