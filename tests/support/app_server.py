"""Serving the app (or only its HTTP routes) from a thread on a free port, for tests.

`serve_app` launches the real Gradio server the way `app.main` does (UI, named API
and the inference-API POST on one port); `serve_routes` runs only the Starlette
routes under uvicorn, for HTTP tests that need an engine of their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from tests.support.waits import wait_until

__all__ = [
    "AppServer",
    "free_port",
    "recording_backend",
    "serve_app",
    "serve_asgi",
    "serve_fixture_app",
    "serve_routes",
    "served_runtime",
    "wait_http",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Wait until `url` answers anything at all over HTTP."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=2.0)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@dataclass(frozen=True)
class AppServer:
    url: str
    demo: object
    engine: object = None  # serve_fixture_app's engine, for fixtures that manage it


@contextmanager
def serve_app(
    engine: object,
    catalog: object,
    *,
    banner: str | None = None,
    hub_url: str = "https://huggingface.co",
    allowed_paths: Sequence[Path] = (),
    backend: object | None = None,
    metrics: bool = False,
) -> Iterator[AppServer]:
    """The full app for `engine` and `catalog`, on 127.0.0.1 and a free port, until the block ends.

    `backend` defaults to a `LocalBackend` over the engine. With `metrics`, `GET /metrics` is served too, as
    `METRICS=1` makes `app.main` do.
    """
    from app import build_demo
    from serving.backends.local import LocalBackend
    from serving.handlers import Handlers
    from serving.http.api import http_routes
    from serving.ui.launch import serve

    backend = backend or LocalBackend.of(engine)  # type: ignore[arg-type]
    handlers = Handlers(backend, catalog, engine.settings)  # type: ignore[arg-type, attr-defined]
    demo = build_demo(handlers, banner=banner, hub_url=hub_url)
    url = serve(
        demo,
        http_routes(handlers, metrics=metrics),
        server_name="127.0.0.1",
        server_port=free_port(),
        allowed_paths=[str(p) for p in allowed_paths],
        block=False,
        quiet=True,
    )
    try:
        yield AppServer(url=url.rstrip("/") + "/", demo=demo)
    finally:
        demo.close()


@contextmanager
def served_runtime(
    environment: Mapping[str, str], demo_dir: Path, *, ready_s: float | None = 600, banner: bool = False
) -> Iterator[tuple[Any, AppServer]]:
    """The app as `app.main` starts it from `environment` on a machine without a GPU (`build_runtime`, the real
    loader), served on a free port with `demo_dir`'s files allowed, until the block ends; with `ready_s`, once
    every pool serves (else at once: a test that watches the pools load); with `banner`, the runtime's banner."""
    from engine.settings import Settings
    from serving.runtime import build_runtime

    runtime = build_runtime(Settings.from_env(dict(environment)), demo_dir=demo_dir, cuda=lambda: False)
    try:
        if ready_s is not None:
            assert runtime.wait_ready(timeout=ready_s)
        engine = runtime.backend.served.default.engine
        shown = runtime.banner if banner else None
        with serve_app(engine, runtime.catalog, banner=shown, backend=runtime.backend, allowed_paths=[demo_dir]) as app:
            yield runtime, app
    finally:
        runtime.close()


@contextmanager
def serve_routes(backend: object) -> Iterator[str]:
    """Only the inference-API route over `backend` (through the handlers, as the app has it), under uvicorn in a
    thread; yields the base URL."""
    from engine.settings import Settings
    from serving.handlers import Handlers
    from serving.http.api import make_routes

    # The routes need no catalogue: they only generate.
    handlers = Handlers(backend, None, Settings())  # type: ignore[arg-type]
    with serve_asgi(Starlette(routes=make_routes(handlers))) as (url, _):
        yield url


@contextmanager
def serve_asgi(app: object) -> Iterator[tuple[str, uvicorn.Server]]:
    """Any ASGI app under uvicorn in a thread, on a free port; yields its base URL and the server (whose
    `server_state.connections` are the open ones)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="http-api-test", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until(lambda: server.started or not thread.is_alive(), f"uvicorn to start on port {port}")
        if not server.started:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        yield url, server
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def recording_backend(engine: object) -> object:
    """The app's LocalBackend, also reporting how each generation ended on `.outcomes` (a result or a
    SwitchboardError), whichever transport asked for it."""
    from engine.errors import GenerationCancelledError, SwitchboardError
    from engine.pools.pools import Pools
    from serving.backends.local import LocalBackend

    class RecordingBackend(LocalBackend):
        def __init__(self, engine: object) -> None:
            super().__init__(Pools.single(engine))  # type: ignore[arg-type]
            self.outcomes: queue.Queue[object] = queue.Queue()

        async def generate(self, request, **kwargs):
            try:
                result = await super().generate(request, **kwargs)
            except SwitchboardError as e:
                self.outcomes.put(e)
                raise
            except asyncio.CancelledError:
                # The client went away (or cancelled): its request was cancelled with it.
                self.outcomes.put(GenerationCancelledError("the request was cancelled"))
                raise
            self.outcomes.put(result)
            return result

    return RecordingBackend(engine)


@contextmanager
def serve_fixture_app(
    loaded: object,
    settings: object,
    hub: object,
    fixtures: object,
    *,
    metrics: bool = False,
    backend: Callable[[object], object] | None = None,
) -> Iterator[AppServer]:
    """The full app over the session's tiny pipeline, a catalogue of the stand-in Hub and the local fixtures.

    `backend(engine)` builds the app's backend (a plain LocalBackend over the engine when None).
    """
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver
    from lora_catalog.catalog import Catalog
    from lora_catalog.hub import HubSource

    catalog = Catalog(HubSource(endpoint=hub.url, timeout_s=5), local_dirs=(fixtures.local_dir,))
    resolver = AdapterResolver(catalog, local_dir=fixtures.local_dir, token=None, max_bytes=settings.max_adapter_bytes)
    engine = Engine(loaded, settings, resolver)
    try:
        built = backend(engine) if backend is not None else None
        with serve_app(
            engine, catalog, hub_url=hub.url, allowed_paths=[fixtures.local_dir], metrics=metrics, backend=built
        ) as served:
            yield dataclasses.replace(served, engine=engine)
    finally:
        engine.close()
        catalog.close()
