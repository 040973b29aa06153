"""Start-up wiring: which model to serve, and the engine, catalogue and GPU runner around it.

`build_runtime(settings)` decides once, at start:

- `MODEL_ID` set: serve exactly that (a Hub id, a local diffusers folder, or `tiny`), or fail loudly;
- `BACKEND_URL` set: a front end; the catalogue is browsed here, generation runs on that Ray Serve
  cluster (`serving.remote`, `serving.cluster`) and nothing is loaded here;
- nothing set: SDXL when a CUDA device is present and its weights can be had (the Hub answers, or
  they are in the local Hugging Face cache); otherwise the offline demo — the tiny random-weight
  pipeline with synthetic LoRAs made on this machine, and a banner that says so.

`GpuRunner` is the one way the UI, `gradio_client` and the HTTP endpoint generate: each request is
queued on the engine's scheduler (one queue, one limit, one position for every transport), prepared
(resolved, downloaded, converted) on its pool outside the `@spaces.GPU` function, and run inside it once
admitted, so on ZeroGPU the borrowed GPU time is spent on swapping and inference only. The async path
(`complete`) waits on the scheduler without holding a thread; only the admitted request runs in one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx2
import spaces
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from engine.compare import CompareLimits, CompareRequest, CompareResult, plan_cells, prepare_cells
from engine.errors import GenerationError, SettingsError, SwitchboardError
from engine.pipeline import LoadedPipeline, load_pipeline
from engine.requests import GenerateRequest, GenerateResult
from engine.resolve import AdapterResolver
from engine.scheduler import QueueView, Ticket
from engine.service import Engine, PreparedRequest, Preview
from engine.settings import DEFAULT_MODEL_ID, TINY_MODEL_ID, Settings
from engine.worker_cache import GpuOutcome, WorkerCache, WorkerView
from lora_catalog.catalog import Catalog
from lora_catalog.hub import HubSource
from lora_catalog.snapshot import default_snapshot_path

from .demo import DEMO_LORAS, ensure_demo_loras, render_previews
from .remote import RemoteEngine, RemoteRunner

__all__ = ["REPO_ROOT", "GpuRunner", "Runtime", "StartPlan", "build_runtime", "plan_start", "probe_base"]

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
# Long enough for a healthy Hub from a Space, short enough that a dead one does not hold up start-up.
_PROBE_TIMEOUT_S = 3.0
# ZeroGPU bills the declared duration; SDXL at 1024² runs roughly 2-3 steps a second on the GPUs it lends.
_GPU_BASE_S = 10
_GPU_S_PER_MEGAPIXEL_STEP = 0.5
_GPU_MAX_S = 120

Progress = Callable[[int, int], None]
CellProgress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class StartPlan:
    """What to load: the settings for it, and whether (and why) it is the offline demo."""

    settings: Settings
    demo: bool
    reason: str | None = None


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


@dataclass(frozen=True)
class Runtime:
    """Everything the Space serves, built once at start."""

    settings: Settings
    engine: Engine | RemoteEngine
    catalog: Catalog
    runner: GpuRunner | RemoteRunner
    banner: str | None
    demo: bool
    hub_url: str
    local_dirs: tuple[Path, ...]
    boot_s: float
    preview_thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for background start-up work (demo previews); False if it still runs after `timeout`."""
        if self.preview_thread is None:
            return True
        self.preview_thread.join(timeout)
        return not self.preview_thread.is_alive()

    def close(self) -> None:
        """Stop background work (at most one preview finishes), then put the base weights back."""
        self.stop.set()
        if self.preview_thread is not None:
            self.preview_thread.join()
        self.catalog.close()
        self.engine.close()


def probe_base(settings: Settings) -> str | None:
    """None when the base model's weights can be had (in the HF cache, or the Hub answers); else why not."""
    repo = settings.base_model_id if settings.is_tiny else settings.model_id
    cached = try_to_load_from_cache(repo, "model_index.json")
    if isinstance(cached, str):
        return None
    url = hf_hub_url(repo, "model_index.json")
    timeout = min(_PROBE_TIMEOUT_S, settings.hub_timeout_s)
    try:
        get_hf_file_metadata(url, token=settings.hf_token or False, timeout=timeout)
    except OfflineModeIsEnabled:
        return "HF_HUB_OFFLINE is set and the model is not in the local cache"
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        return f"the Hub answered HTTP {status} for {repo}"
    except (httpx2.HTTPError, OSError) as e:
        return f"the Hugging Face Hub at {hf_constants.ENDPOINT} could not be reached ({type(e).__name__})"
    return None


def plan_start(
    settings: Settings, *, cuda: Callable[[], bool], probe: Callable[[Settings], str | None] = probe_base
) -> StartPlan:
    """Decide what to serve; probes run only when their answer matters."""
    if settings.model_id_explicit:
        if settings.is_tiny:
            return StartPlan(settings, demo=True, reason=f"MODEL_ID={TINY_MODEL_ID} is set")
        return StartPlan(settings, demo=False)
    demo = settings.replace(model_id=TINY_MODEL_ID, base_model_id=DEFAULT_MODEL_ID)
    if not cuda():
        return StartPlan(demo, demo=True, reason="no CUDA GPU was found")
    why_not = probe(settings)
    if why_not is not None:
        return StartPlan(demo, demo=True, reason=why_not)
    return StartPlan(settings, demo=False)


def build_runtime(
    settings: Settings,
    *,
    demo_dir: Path | None = None,
    cuda: Callable[[], bool] = torch.cuda.is_available,
    probe: Callable[[Settings], str | None] = probe_base,
    hub_endpoint: str | None = None,
    load: Callable[..., LoadedPipeline] = load_pipeline,
) -> Runtime:
    """Load the model `settings` call for (or the demo) and wire the engine and catalogue around it.

    `cuda`, `probe` and `load` are the environment's answers, replaceable in tests; `hub_endpoint`
    overrides huggingface_hub's endpoint for the catalogue.
    """
    started = time.perf_counter()
    if settings.backend_url is not None:
        return _serve_remote(settings, started, hub_endpoint)
    plan = plan_start(settings, cuda=cuda, probe=probe)
    if not plan.demo:
        try:
            return _serve_model(plan.settings, started, hub_endpoint, load)
        except (OSError, ValueError, SwitchboardError) as e:
            if settings.model_id_explicit:
                raise SettingsError(f"MODEL_ID={settings.model_id!r} could not be loaded: {e}") from e
            logger.exception("could not load %s; starting the offline demo instead", settings.model_id)
            plan = StartPlan(
                settings.replace(model_id=TINY_MODEL_ID, base_model_id=DEFAULT_MODEL_ID),
                demo=True,
                reason=f"loading {settings.model_id} failed ({type(e).__name__}: {e})",
            )
    return _serve_demo(plan, demo_dir or REPO_ROOT / "demo_data", started, hub_endpoint, load)


def _serve_model(
    settings: Settings, started: float, hub_endpoint: str | None, load: Callable[..., LoadedPipeline]
) -> Runtime:
    # On ZeroGPU the GPU exists only inside @spaces.GPU calls, so warming up at start would run on none.
    loaded = load(settings, warm=not settings.zero_gpu)
    hub, catalog, local_dirs = _hub_catalog(settings, hub_endpoint)
    resolver = AdapterResolver(
        catalog,
        local_dir=settings.local_lora_dir,
        token=settings.hf_token,
        max_bytes=settings.max_adapter_bytes,
        timeout_s=settings.hub_timeout_s,
    )
    engine = Engine(loaded, settings, resolver)
    boot_s = time.perf_counter() - started
    logger.info("serving %s on %s (start-up %.1f s)", settings.model_id, loaded.device, boot_s)
    return Runtime(
        settings=settings,
        engine=engine,
        catalog=catalog,
        runner=GpuRunner(engine, zero_gpu=settings.zero_gpu),
        banner=None,
        demo=False,
        hub_url=hub.endpoint,
        local_dirs=local_dirs,
        boot_s=boot_s,
    )


def _hub_catalog(settings: Settings, hub_endpoint: str | None) -> tuple[HubSource, Catalog, tuple[Path, ...]]:
    hub = HubSource(endpoint=hub_endpoint, token=settings.hf_token, timeout_s=settings.hub_timeout_s)
    local_dirs = (settings.local_lora_dir,) if settings.local_lora_dir else ()
    catalog = Catalog(
        hub,
        snapshot_path=_snapshot_path(settings),
        local_dirs=local_dirs,
        refresh=settings.catalog_refresh,
    )
    return hub, catalog, local_dirs


def _serve_remote(settings: Settings, started: float, hub_endpoint: str | None) -> Runtime:
    """A front end: the catalogue here, generation (and LoRA checks, status) on the cluster at BACKEND_URL."""
    assert settings.backend_url is not None
    runner = RemoteRunner(settings.backend_url, timeout_s=settings.backend_timeout_s)
    try:
        engine = RemoteEngine(runner, settings)
    except SettingsError:
        runner.close()
        raise
    hub, catalog, local_dirs = _hub_catalog(settings.replace(base_model_id=engine.base_model_id), hub_endpoint)
    boot_s = time.perf_counter() - started
    logger.info(
        "front end for the cluster at %s serving %s (start-up %.1f s)", runner.url, engine.base_model_id, boot_s
    )
    return Runtime(
        settings=settings,
        engine=engine,
        catalog=catalog,
        runner=runner,
        banner=None,
        demo=False,
        hub_url=hub.endpoint,
        local_dirs=local_dirs,
        boot_s=boot_s,
    )


def _serve_demo(
    plan: StartPlan, demo_dir: Path, started: float, hub_endpoint: str | None, load: Callable[..., LoadedPipeline]
) -> Runtime:
    demo_dir = demo_dir.resolve()
    settings = plan.settings.replace(local_lora_dir=demo_dir)
    # The first previews warm the pipeline up; a separate warm-up would only delay the first page.
    loaded = load(settings, warm=False)
    ensure_demo_loras(demo_dir, loaded.pipe)
    resolver = AdapterResolver(None, local_dir=demo_dir, token=None, max_bytes=settings.max_adapter_bytes)
    engine = Engine(loaded, settings, resolver)
    catalog = Catalog(None, local_dirs=(demo_dir,), refresh=False)
    previews, stop = None, threading.Event()
    if any(not (demo_dir / f"{lora.stem}.png").is_file() for lora in DEMO_LORAS):
        previews = threading.Thread(
            target=_render_previews, args=(engine, catalog, demo_dir, stop), name="demo-previews", daemon=True
        )
        previews.start()
    boot_s = time.perf_counter() - started
    logger.warning("serving the offline demo (%s); start-up %.1f s", plan.reason, boot_s)
    return Runtime(
        settings=settings,
        engine=engine,
        catalog=catalog,
        runner=GpuRunner(engine, zero_gpu=settings.zero_gpu),
        banner=demo_banner(plan.reason or "no reason given"),
        demo=True,
        hub_url=(hub_endpoint or hf_constants.ENDPOINT).rstrip("/"),
        local_dirs=(demo_dir,),
        boot_s=boot_s,
        preview_thread=previews,
        stop=stop,
    )


def _render_previews(engine: Engine, catalog: Catalog, folder: Path, stop: threading.Event) -> None:
    try:
        render_previews(engine, folder, stop=stop)
    except (SwitchboardError, OSError) as e:
        logger.warning("could not render the demo previews in %s: %s", folder, e)
    catalog.rescan_local()


def demo_banner(reason: str) -> str:
    """The offline demo's banner (Markdown): what this is, why, and how to get the real thing."""
    return (
        "**Offline demo: you are looking at a tiny random-weight model.** "
        f"It has SDXL's structure but random weights, so every image is a noise-like pattern, not art; "
        f"the {len(DEMO_LORAS)} LoRAs are synthetic ones made on this machine. "
        f"Why: {reason}. "
        "To run the real model, start it on a machine with a CUDA GPU and access to the Hugging Face Hub "
        "(for example a GPU Space), or set `MODEL_ID` to an SDXL repo id or a local diffusers folder."
    )


def _snapshot_path(settings: Settings) -> Path | None:
    if settings.catalog_snapshot is not None:
        return settings.catalog_snapshot
    default = REPO_ROOT / default_snapshot_path(settings.base_model_id)
    return default if default.is_file() else None
