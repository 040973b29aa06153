"""The Space as a front end: generation on a Ray Serve cluster (`BACKEND_URL`), everything else local.

`RemoteRunner` has `GpuRunner`'s interface, so the UI, the `gradio_client` API and `POST /` use it
unchanged. It sends the whole request to the cluster's `POST /v1/generate` (`serving.cluster.ingress`)
and rebuilds the `GenerateResult` (lossless PNG, the normalised request, timings, cache use). A JSON
error from the cluster becomes the same class of the one tree (`serving.cluster.wire.error_from_body`), so the
user sees the message they would have seen from a local pipeline; a cluster that cannot be reached is a
`BackendUnavailableError` (503). Progress is not streamed from the cluster: the bar jumps at the end.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from engine.compare import CompareResult
from engine.errors import (
    BackendUnavailableError,
    GenerationCancelledError,
    InvalidRequestError,
    SettingsError,
    SwitchboardError,
)
from engine.events import EngineEvents
from engine.pools.engine import EngineStatus, LoraCheck, Preview
from engine.pools.scheduler import QueueView
from engine.requests import GenerateRequest, GenerateResult, LoraSpec, ModelDefaults
from engine.settings import Settings
from serving.cluster.wire import (
    check_from_json,
    decode_png,
    defaults_from_json,
    error_from_body,
    request_to_json,
    result_from_json,
    status_from_json,
)

__all__ = ["RemoteEngine", "RemoteRunner"]

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
# How often a waiting request looks at its cancel flag (the HTTP call runs in a helper thread meanwhile).
_CANCEL_POLL_S = 0.1


class RemoteRunner:
    """Generate on the cluster at `url`; one pooled HTTP client, safe to share between threads."""

    # The cluster routes between its own pools (by the base a request names); none are known here.
    pools: None = None

    def __init__(self, url: str, *, timeout_s: float, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), transport=transport)

    def generate(
        self,
        request: GenerateRequest,
        *,
        base: str = "",
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> GenerateResult:
        """Generate `request` on the cluster (on the pool of `base`, a base repo id, when given)."""
        path = f"/v1/models/{quote(base.strip(), safe='/')}/generate" if base.strip() else "/v1/generate"
        started = time.perf_counter()
        response = self._post(path, request_to_json(request), cancel)
        if response.status_code != 200:
            try:
                body = response.json()
            except ValueError:
                body = None
            raise error_from_body(body, response.status_code)
        try:
            document = response.json()
            result = result_from_json(document["result"], decode_png(document["image"]))
        except (ValueError, KeyError, TypeError) as e:
            raise BackendUnavailableError(f"the backend at {self.url} answered something unreadable: {e}") from e
        if progress is not None:
            progress(result.request.steps or 1, result.request.steps or 1)
        logger.info(
            "generated on %s in %.2f s (%.2f s there)", self.url, time.perf_counter() - started, result.timings.total
        )
        return result

    def compare(self, request: object, **kwargs: object) -> CompareResult:
        """Comparison grids need the pipeline in this process: not offered with BACKEND_URL."""
        raise InvalidRequestError(
            "comparison grids are not served when this Space is a front end (BACKEND_URL is set); "
            "accepted: /generate, one image at a time"
        )

    async def compare_async(self, request: object, **kwargs: object) -> CompareResult:
        return self.compare(request, **kwargs)

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
        """`generate` for the Space's async handlers: the cluster queues it (no place or previews come back)."""
        return await anyio.to_thread.run_sync(
            partial(self.generate, request, base=base, progress=progress, cancel=cancel)
        )

    def _post(self, path: str, document: dict, cancel: threading.Event | None) -> httpx.Response:
        if cancel is None:
            return self._send(path, document)
        # Closing a pooled client from another thread would cut other users' calls: wait in a helper
        # thread instead, and walk away (the cluster stops when its ingress sees the connection go) on cancel.
        outcome: dict[str, httpx.Response | BaseException] = {}
        done = threading.Event()

        def call() -> None:
            try:
                outcome["response"] = self._send(path, document)
            except BaseException as e:
                outcome["error"] = e
            finally:
                done.set()

        threading.Thread(target=call, name="backend-call", daemon=True).start()
        while not done.wait(_CANCEL_POLL_S):
            if cancel.is_set():
                raise GenerationCancelledError("the request was cancelled while the backend generated it")
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["response"]  # type: ignore[return-value]

    def _send(self, path: str, document: dict) -> httpx.Response:
        return self._call("POST", path, document)

    def _call(self, method: str, path: str, document: dict | None) -> httpx.Response:
        try:
            return self._client.request(method, self.url + path, json=document)
        except httpx.HTTPError as e:
            raise BackendUnavailableError(
                f"the backend at {self.url} could not be reached ({type(e).__name__}: {e}); try again shortly"
            ) from e

    def get(self, path: str) -> Any:
        """A JSON answer of the cluster (`/v1/info`, `/v1/status`); its errors raised as the tree's classes."""
        return self._answer(self._call("GET", path, None))

    def post(self, path: str, document: dict) -> Any:
        return self._answer(self._call("POST", path, document))

    def _answer(self, response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or body is None:
            raise error_from_body(body, response.status_code)
        return body

    def close(self) -> None:
        self._client.close()


class RemoteEngine:
    """What the UI asks of an engine besides generating, answered by the cluster's default pool.

    The request defaults and served base are read once at start (a Space whose cluster is down fails
    to start, saying so); the LoRA check and the status are asked for each time.
    """

    def __init__(self, runner: RemoteRunner, settings: Settings) -> None:
        self._runner = runner
        self.settings = settings
        # Metrics count this Space's requests by transport; the cluster's replicas report their own timings.
        self.events = EngineEvents()
        try:
            info = runner.get("/v1/info")
            self.defaults: ModelDefaults = defaults_from_json(info["defaults"])
            self.base_model_id: str = str(info["base_model_id"])
        except (SwitchboardError, KeyError, TypeError) as e:
            raise SettingsError(f"BACKEND_URL={runner.url!r} did not answer what this Space needs: {e}") from e

    def check_lora(self, spec: LoraSpec) -> LoraCheck:
        return check_from_json(self._runner.post("/v1/check", asdict(spec)))

    def prefetch(self, spec: LoraSpec) -> concurrent.futures.Future[None]:
        """A gallery click: the cluster checks (and so prepares) the LoRA, off the UI's thread."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()

        def check() -> None:
            try:
                self.check_lora(spec)
            except BaseException as e:  # handed to whoever awaits the future
                future.set_exception(e)
            else:
                future.set_result(None)

        threading.Thread(target=check, name="remote-prefetch", daemon=True).start()
        return future

    def status(self) -> EngineStatus:
        return status_from_json(self._runner.get("/v1/status"))

    def close(self) -> None:
        self._runner.close()
