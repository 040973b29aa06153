"""The launched service and its clients for `bench.serve` (imported only after the Hub's environment is set)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from gradio_client import Client

from app import build_demo
from engine.families.tiny import ensure_tiny_pipeline
from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine, PreparedRequest
from engine.pools.scheduler import Ticket, TicketState
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from engine.settings import DEFAULT_MODEL_ID, Settings
from lora_catalog.catalog import Catalog
from lora_catalog.hub import HubSource
from serving.backends.local import LocalBackend
from serving.handlers import Handlers
from serving.http.api import http_routes
from serving.ui.launch import serve
from tests.support.app_server import free_port
from tests.support.loras import WEIGHTS, card, peft_file
from tests.support.standin_hub import StandInHub

from .serve_model import MODES, ModeResult, Options, Sample, draws, sizes_mb

_TIMEOUT_S = 900.0


def repo_id(mode: str, index: int) -> str:
    return f"bench-{mode.replace('_', '-')}/lora-{index:03d}"


class Bench:
    """One stand-in Hub with a copy of the LoRAs per mode, and the tiny pipeline both modes serve from."""

    def __init__(self, options: Options, root: Path, port: int) -> None:
        self.options = options
        self.hub = StandInHub(root / "hub", port=port)
        self.hub.start()
        self.settings = Settings(
            model_id=str(ensure_tiny_pipeline(root / "tiny")),
            base_model_id=DEFAULT_MODEL_ID,
            device="cpu",
            dtype="float32",
            max_queue=max(16, 2 * options.clients),
            affinity_max_skip=options.max_skip,
            prepare_workers=options.workers,
            hub_timeout_s=60.0,
        )
        self.loaded = load_pipeline(self.settings, warm=True)
        self.delays = [size / options.bandwidth_mb_s for size in sizes_mb(options)]
        for mode in MODES:
            for index in range(options.adapters):
                data = peft_file(self.loaded.pipe, seed=index)
                self.hub.add_repo(repo_id(mode, index), {"README.md": card(), WEIGHTS: data}, tags=["lora"])

    def close(self) -> None:
        self.hub.stop()

    def run(self, mode: str) -> ModeResult:
        catalog = Catalog(HubSource(endpoint=self.hub.url, timeout_s=60), local_dirs=(), refresh=False)
        resolver = AdapterResolver(
            catalog, local_dir=None, token=None, max_bytes=self.settings.max_adapter_bytes, timeout_s=60
        )
        engine = Engine(self.loaded, self.settings.replace(scheduler=mode), resolver)
        runs: list[tuple[float, float, bool]] = []
        real_run = engine.run

        def timed_run(prepared: PreparedRequest, **kwargs: object) -> GenerateResult:
            started = time.perf_counter()
            result = real_run(prepared, **kwargs)  # type: ignore[arg-type]
            runs.append((started, time.perf_counter(), result.swapped))
            return result

        # Swap and inference only: in fifo_inline the slot also holds the download, which is not GPU work.
        engine.run = timed_run  # type: ignore[method-assign]
        runnable: list[tuple[float, float]] = []
        real_finish = engine.scheduler.finish

        def finish(ticket: Ticket[PreparedRequest]) -> None:
            real_finish(ticket)
            # The harness reads the ticket after the scheduler is done with it (no one writes it any more).
            if ticket.state is TicketState.DONE:
                runnable.append((ticket.ready_at or ticket.submitted, time.perf_counter()))

        engine.scheduler.finish = finish  # type: ignore[method-assign]
        self._warm(engine, mode)
        handlers = Handlers(LocalBackend.of(engine), catalog, engine.settings)
        demo = build_demo(handlers)
        url = serve(
            demo, http_routes(handlers), server_name="127.0.0.1", server_port=free_port(), block=False, quiet=True
        )
        try:
            samples, wall = self._load(mode, url)
        finally:
            demo.close()
            engine.close()
            catalog.close()
        print(f"{mode}: {len(samples)} requests in {wall:.1f} s", flush=True)
        return ModeResult(mode, tuple(samples), tuple(runs), tuple(runnable), engine.scheduler.max_overtaken, wall)

    def _warm(self, engine: Engine, mode: str) -> None:
        """The most popular LoRAs into the cache, with no download delay (the clock has not started)."""
        warm = range(self.options.warm)
        for index in warm:
            self.hub.set_download_delay(repo_id(mode, index), 0.0)
        warm_cache(engine, [LoraSpec(repo_id(mode, index)) for index in warm])
        for index in range(self.options.adapters):
            self.hub.set_download_delay(repo_id(mode, index), self.delays[index])

    def _load(self, mode: str, url: str) -> tuple[list[Sample], float]:
        options = self.options
        plan = draws(options)
        samples: list[Sample] = []
        lock = threading.Lock()
        start = threading.Barrier(options.clients + 1)
        gradio_clients = max(1, options.clients // 4)

        def client(number: int) -> None:
            transport = "gradio_client" if number < gradio_clients else "post"
            api = Client(url, verbose=False) if transport == "gradio_client" else None
            start.wait(timeout=_TIMEOUT_S)
            for turn, (index, pause) in enumerate(plan[number]):
                time.sleep(pause)
                ref, seed = repo_id(mode, index), 1000 * number + turn
                sent = time.perf_counter()
                ok, error = True, ""
                try:
                    if api is not None:
                        api.predict(
                            prompt="a lighthouse",
                            lora=ref,
                            lora_scale=1.0,
                            steps=options.steps,
                            width=64,
                            height=64,
                            seed=seed,
                            api_name="/generate",
                        )
                    else:
                        parameters = {"num_inference_steps": options.steps, "width": 64, "height": 64, "seed": seed}
                        answer = httpx.post(
                            url,
                            json={"inputs": "a lighthouse", "parameters": parameters},
                            headers={"lora": ref},
                            timeout=_TIMEOUT_S,
                        )
                        ok, error = answer.status_code == 200, "" if answer.status_code == 200 else answer.text[:200]
                except Exception as e:  # recorded as a failed request and reported, never dropped
                    ok, error = False, f"{type(e).__name__}: {e}"
                sample = Sample(mode, number, transport, index, sent, time.perf_counter(), ok, error)
                with lock:
                    samples.append(sample)

        with concurrent.futures.ThreadPoolExecutor(options.clients) as pool:
            futures = [pool.submit(client, number) for number in range(options.clients)]
            start.wait(timeout=_TIMEOUT_S)
            began = time.perf_counter()
            for future in futures:
                future.result()
        return samples, time.perf_counter() - began


def warm_cache(engine: Engine, specs: Sequence[LoraSpec]) -> None:
    """Prepare each LoRA into the engine's cache through the request path, which waits its turn: the prefetch
    lane is bounded and drops its oldest past MAX_QUEUE waiting (a gallery click superseded), so a warm-up of
    more LoRAs than that through it was refused (`EngineBusyError`)."""
    for spec in specs:
        with engine.prepare(GenerateRequest(prompt="warm-up", loras=(spec,))):
            pass
