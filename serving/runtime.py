"""Start-up wiring: which pools to serve (or which cluster to front), and the backend and catalogue around them.

`build_runtime(settings)` decides once: `MODELS`/`MODEL_ID` serve exactly those pools or fail loudly;
`BACKEND_URL` makes a front end for a Ray Serve cluster (nothing loaded here); nothing set serves SDXL (and
SD 1.5 beside it on 20 GB or more) when a CUDA device and the weights are there, else the offline demo of tiny
random-weight pipelines with synthetic LoRAs and a banner saying so. Either way the result is the one
`Backend` every transport calls (`LocalBackend` or `RemoteBackend`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from engine.errors import SettingsError, SwitchboardError
from engine.pipeline.loading import LoadedPipeline, load_pipeline
from engine.pools.pools import build_pools
from engine.prepare.civitai import CivitaiFiles, civitai_files
from engine.prepare.resolve import AdapterResolver
from engine.settings import (
    DEFAULT_MODEL_ID,
    DEFAULT_POOLS,
    DEMO_LATER_POOLS,
    DEMO_POOLS,
    TINY_MODEL_ID,
    PoolSetting,
    Settings,
)
from lora_catalog.catalog import Catalog
from lora_catalog.hub import HubSource
from lora_catalog.snapshot import default_snapshot_path
from serving.backends import Backend
from serving.backends.growing import GrowingBackend
from serving.backends.local import LocalBackend
from serving.backends.remote import RemoteBackend
from serving.demo.background import DemoWork
from serving.demo.later_loras import later_loras
from serving.demo.loras import demo_loras, ensure_demo_loras
from serving.ui.pool_views import display_name

__all__ = [
    "DEFAULT_POOLS",
    "DEMO_POOLS",
    "REPO_ROOT",
    "Runtime",
    "StartPlan",
    "build_runtime",
    "front_end",
    "gpu_bytes",
    "plan_start",
    "probe_base",
]

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
# Long enough for a healthy Hub from a Space, short enough that a dead one does not hold up start-up.
_PROBE_TIMEOUT_S = 3.0
# An A10G (24 GB) holds SDXL (about 7 GB in fp16) and SD 1.5 (about 2.5 GB) with room to generate.
_TWO_POOL_GPU_BYTES = 20 * 10**9


@dataclass(frozen=True)
class StartPlan:
    """What to load: the settings for it, and whether (and why) it is the offline demo."""

    settings: Settings
    demo: bool
    reason: str | None = None


@dataclass(frozen=True)
class Runtime:
    """Everything the Space serves, built once at start."""

    settings: Settings
    backend: Backend
    catalog: Catalog
    banner: str | None
    demo: bool
    hub_url: str
    local_dirs: tuple[Path, ...]
    boot_s: float
    preview_thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def start_background(self) -> None:
        """Start the background work (the demo's later pools, then its previews) if it waits for this (see
        `build_runtime`'s `background`); once only."""
        thread = self.preview_thread
        if thread is not None and thread.ident is None:
            thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for background start-up work (the demo's later pools, its previews); False if it still runs after
        `timeout` (or was never started)."""
        if self.preview_thread is None:
            return True
        if self.preview_thread.ident is None:
            return False
        self.preview_thread.join(timeout)
        return not self.preview_thread.is_alive()

    def close(self) -> None:
        """Stop background work (at most one preview finishes), then put every pool's base weights back."""
        self.stop.set()
        if self.preview_thread is not None and self.preview_thread.ident is not None:
            self.preview_thread.join()
        self.catalog.close()
        self.backend.close()


def probe_base(settings: Settings) -> str | None:
    """None when the base model's weights can be had (in the HF cache, or the Hub answers); else why not."""
    repo = settings.base_model_id if settings.loads_tiny else settings.model_id
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


def gpu_bytes() -> int:
    """Total memory of the first CUDA device (0 without one)."""
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0


def plan_start(
    settings: Settings,
    *,
    cuda: Callable[[], bool],
    probe: Callable[[Settings], str | None] = probe_base,
    device_bytes: Callable[[], int] = gpu_bytes,
) -> StartPlan:
    """Decide what to serve; probes run only when their answer matters."""
    if settings.model_id_explicit:
        if settings.loads_tiny:
            named = f"MODELS={','.join(p.model_id for p in settings.pools)}" if settings.pools else None
            return StartPlan(settings, demo=True, reason=f"{named or f'MODEL_ID={settings.model_id}'} is set")
        return StartPlan(settings, demo=False)
    if not cuda():
        return StartPlan(_demo_settings(settings), demo=True, reason="no CUDA GPU was found")
    why_not = probe(settings)
    if why_not is not None:
        return StartPlan(_demo_settings(settings), demo=True, reason=why_not)
    if device_bytes() >= _TWO_POOL_GPU_BYTES:
        return StartPlan(settings.replace(pools=DEFAULT_POOLS), demo=False)
    return StartPlan(settings, demo=False)


def _demo_settings(settings: Settings) -> Settings:
    # The offline demo's tiny pools start in seconds and stay eager whatever COMPILE says.
    return settings.replace(model_id=TINY_MODEL_ID, base_model_id=DEFAULT_MODEL_ID, pools=DEMO_POOLS, compile="off")


def build_runtime(
    settings: Settings,
    *,
    demo_dir: Path | None = None,
    cuda: Callable[[], bool] = torch.cuda.is_available,
    probe: Callable[[Settings], str | None] = probe_base,
    hub_endpoint: str | None = None,
    load: Callable[..., LoadedPipeline] = load_pipeline,
    device_bytes: Callable[[], int] = gpu_bytes,
    later: tuple[PoolSetting, ...] = DEMO_LATER_POOLS,
    background: bool = True,
) -> Runtime:
    """Load the pools `settings` call for (or the demo) and wire the engines and catalogue around them.

    `later`: the pools the demo loads in the background (tests may leave them out); `background=False`: that
    work waits for `Runtime.start_background` (the entry point's, once the page is up: it would slow the page's
    start on two cores);
    `cuda`, `probe`, `load` and `device_bytes` are the environment's answers, replaceable in tests;
    `hub_endpoint` overrides huggingface_hub's endpoint for the catalogue.
    """
    started = time.perf_counter()
    if settings.backend_url is not None:
        return _serve_remote(settings, started, hub_endpoint)
    plan = plan_start(settings, cuda=cuda, probe=probe, device_bytes=device_bytes)
    if not plan.demo:
        try:
            return _serve_model(plan.settings, started, hub_endpoint, load)
        except (OSError, ValueError, SwitchboardError) as e:
            if settings.model_id_explicit:
                what = "MODELS" if settings.pools else f"MODEL_ID={settings.model_id!r}"
                raise SettingsError(f"{what} could not be loaded: {e}") from e
            logger.exception("could not load %s; starting the offline demo instead", settings.model_id)
            plan = StartPlan(
                _demo_settings(settings),
                demo=True,
                reason=f"loading {settings.model_id} failed ({type(e).__name__}: {e})",
            )
    runtime = _serve_demo(plan, demo_dir or REPO_ROOT / "demo_data", started, hub_endpoint, load, later)
    if background:
        runtime.start_background()
    return runtime


def _serve_model(
    settings: Settings, started: float, hub_endpoint: str | None, load: Callable[..., LoadedPipeline]
) -> Runtime:
    civitai = civitai_files(settings)
    hub, catalog, local_dirs = _hub_catalog(settings, hub_endpoint, civitai)
    resolver = AdapterResolver(
        catalog,
        local_dir=settings.local_lora_dir,
        token=settings.hf_token,
        max_bytes=settings.max_adapter_bytes,
        timeout_s=settings.hub_timeout_s,
        civitai=civitai,
    )
    try:
        # On ZeroGPU the GPU exists only inside @spaces.GPU calls, so warming up at start would run on none.
        pools = build_pools(settings, resolver, load, warm=not settings.zero_gpu)
    except BaseException:
        catalog.close()
        raise
    backend = LocalBackend(pools, zero_gpu=settings.zero_gpu)
    if settings.zero_gpu and settings.compile != "off":
        # No GPU at start outside a GPU call, so no warm-up compiles: one call compiles ahead of time instead.
        backend.compile_ahead(settings.compile)
    boot_s = time.perf_counter() - started
    logger.info("serving %s (start-up %.1f s)", ", ".join(pools.served_bases), boot_s)
    return Runtime(
        settings=settings,
        backend=backend,
        catalog=catalog,
        banner=None,
        demo=False,
        hub_url=hub.endpoint,
        local_dirs=local_dirs,
        boot_s=boot_s,
    )


def _hub_catalog(
    settings: Settings, hub_endpoint: str | None, civitai: CivitaiFiles | None
) -> tuple[HubSource, Catalog, tuple[Path, ...]]:
    hub = HubSource(endpoint=hub_endpoint, token=settings.hf_token, timeout_s=settings.hub_timeout_s)
    local_dirs = (settings.local_lora_dir,) if settings.local_lora_dir else ()
    catalog = Catalog(
        hub,
        snapshot_path=_snapshot_path(settings),
        local_dirs=local_dirs,
        refresh=settings.catalog_refresh,
        civitai=civitai.source if civitai is not None else None,
    )
    return hub, catalog, local_dirs


def _serve_remote(settings: Settings, started: float, hub_endpoint: str | None) -> Runtime:
    """A front end for the cluster at BACKEND_URL (`front_end`)."""
    assert settings.backend_url is not None
    backend = RemoteBackend(settings.backend_url, timeout_s=settings.backend_timeout_s)
    return front_end(settings, backend, started=started, hub_endpoint=hub_endpoint)


def front_end(
    settings: Settings, backend: Backend, *, started: float | None = None, hub_endpoint: str | None = None
) -> Runtime:
    """A front end over a cluster's `backend` (`RemoteBackend` at BACKEND_URL, or the cluster's own
    `ServeBackend`): the catalogue here, generation (and LoRA checks, status) on the cluster."""
    started = time.perf_counter() if started is None else started
    base = backend.pools()[0].base_model_id
    # The front end describes Civitai LoRAs (cards, /lora_info); the cluster's replicas download them.
    civitai = civitai_files(settings)
    hub, catalog, local_dirs = _hub_catalog(settings.replace(base_model_id=base), hub_endpoint, civitai)
    boot_s = time.perf_counter() - started
    logger.info("front end for the cluster serving %s (start-up %.1f s)", base, boot_s)
    return Runtime(
        settings=settings,
        backend=backend,
        catalog=catalog,
        banner=None,
        demo=False,
        hub_url=hub.endpoint,
        local_dirs=local_dirs,
        boot_s=boot_s,
    )


def _serve_demo(
    plan: StartPlan,
    demo_dir: Path,
    started: float,
    hub_endpoint: str | None,
    load: Callable[..., LoadedPipeline],
    later: tuple[PoolSetting, ...],
) -> Runtime:
    """The demo's image pools at once; with nothing configured, `later` (a video, a reference-editing and a
    quantized pool) load in the background once the page is up, listed as loading until they serve."""
    demo_dir = demo_dir.resolve()
    settings = plan.settings.replace(local_lora_dir=demo_dir)
    resolver = AdapterResolver(None, local_dir=demo_dir, token=None, max_bytes=settings.max_adapter_bytes)
    # The first previews warm the pipelines up; a separate warm-up would only delay the first page.
    pools = build_pools(settings, resolver, load, warm=False)
    ensure_demo_loras(demo_dir, {p.base_model_id: p.engine.loaded.pipe for p in pools.pools})
    catalog = Catalog(None, local_dirs=(demo_dir,), refresh=False)
    later = () if settings.model_id_explicit else later
    coming = {lora.ref: lora.base for lora in later_loras(tuple(p.base_model_id for p in later))}
    backend = GrowingBackend(LocalBackend(pools, zero_gpu=settings.zero_gpu), later, refs=coming)
    background, stop = None, threading.Event()
    unrendered = any(not (demo_dir / f"{lora.stem}.png").is_file() for lora in demo_loras(pools.served_bases))
    if later or unrendered:
        work = DemoWork(backend, catalog, demo_dir, stop, settings.replace(pools=later), resolver, load)
        background = threading.Thread(target=work.run, name="demo-background", daemon=True)
    boot_s = time.perf_counter() - started
    logger.warning("serving the offline demo (%s); start-up %.1f s", plan.reason, boot_s)
    return Runtime(
        settings=settings,
        backend=backend,
        catalog=catalog,
        banner=demo_banner(plan.reason or "no reason given", pools.served_bases, tuple(p.base_model_id for p in later)),
        demo=True,
        hub_url=(hub_endpoint or hf_constants.ENDPOINT).rstrip("/"),
        local_dirs=(demo_dir,),
        boot_s=boot_s,
        preview_thread=background,
        stop=stop,
    )


def demo_banner(reason: str, served: tuple[str, ...] = (DEFAULT_MODEL_ID,), later: tuple[str, ...] = ()) -> str:
    """The offline demo's banner (Markdown): what this is, why, and how to get the real thing."""
    names = [display_name(base) for base in (*served, *later)]
    structures = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    # The later pools (an fp8, a reference-editing and a video pool) are named last.
    coming = f" (the last {len(later)} load in the background: they show as loading for their first seconds)"
    coming = coming if later else ""
    count = len(demo_loras(served)) + len(later_loras(later))
    return (
        "**Offline demo: you are looking at tiny random-weight models.** "
        f"They have the structure of {structures}{coming} but random weights, so every image is a noise-like "
        f"pattern, not art; the {count} LoRAs are synthetic ones made on this machine. "
        f"Why: {reason}. "
        "To run the real models, start it on a machine with a CUDA GPU and access to the Hugging Face Hub "
        "(for example a GPU Space), or set `MODELS` (or `MODEL_ID`) to SDXL, SD 1.5, SD 2.x or FLUX.1 repo ids "
        "or local diffusers folders."
    )


def _snapshot_path(settings: Settings) -> Path | None:
    if settings.catalog_snapshot is not None:
        return settings.catalog_snapshot
    default = REPO_ROOT / default_snapshot_path(settings.base_model_id)
    return default if default.is_file() else None
