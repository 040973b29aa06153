"""`RemoteBackend`: the Space as a front end, generating on a Ray Serve cluster (`BACKEND_URL`).

It carries the `Backend` operations to the cluster's ingress (`serving.cluster.ingress`, `serving.cluster.wire`).
The served pools are read once at start, so a Space whose cluster is down fails to start, saying so. A cluster's
JSON error becomes the same class of the one tree; an unreachable cluster is `BackendUnavailableError` (503).
Cancelling a call closes its connection. No progress or previews; comparisons are refused. Credentials in the
URL are sent, never shown (`***`). Details: docs/internals.md, "serving/backends/remote.py".
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import asdict
from typing import Any
from urllib.parse import quote

import httpx

from engine.compare import CompareRequest, CompareResult
from engine.errors import BackendUnavailableError, InvalidRequestError, SettingsError, SwitchboardError
from engine.events import EngineEvents, EngineObserver
from engine.outcomes import LoraCheck, PoolStatus, Preview, Progress, ServedPool
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from serving.backends import CellProgress, OnQueue
from serving.cluster.answers import answer_from_json
from serving.cluster.wire import (
    check_from_json,
    error_from_body,
    pools_from_json,
    request_to_json,
    status_from_json,
)

__all__ = ["RemoteBackend"]

logger = logging.getLogger(__name__)

# The userinfo of a URL (`user:pass@` after the scheme), wherever a message quotes one.
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


class RemoteBackend:
    """The cluster at `url` behind the `Backend` operations (see the module docstring)."""

    def __init__(self, url: str, *, timeout_s: float, transport: httpx.MockTransport | None = None) -> None:
        self._url = url.rstrip("/")
        # What is shown of it (messages, logs): the credentials left out.
        self.url = _redacted(self._url)
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        # Tests hand in a transport; it serves the start-up call and every operation's.
        self._transport = transport
        # Metrics count this Space's requests by transport; the cluster's replicas report their own timings.
        self.events = EngineEvents()
        try:
            with httpx.Client(timeout=self._timeout, transport=transport) as client:
                response = client.get(self._url + "/v1/pools")
            self._pools = pools_from_json(self._answer(response))
        except httpx.HTTPError as e:
            raise SettingsError(
                f"BACKEND_URL={self.url!r} could not be reached ({type(e).__name__}: {_redacted(str(e))})"
            ) from None
        except SwitchboardError as e:
            raise SettingsError(f"BACKEND_URL={self.url!r} did not answer what this Space needs: {e}") from e

    def pools(self) -> tuple[ServedPool, ...]:
        return self._pools

    def subscribe(self, observer: EngineObserver) -> None:
        """Only how this Space's requests ended: the engines' own events stay on the cluster's replicas."""
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
        path = f"/v1/models/{quote(base.strip(), safe='/')}/generate" if base.strip() else "/v1/generate"
        started = time.perf_counter()
        document = await self._call("POST", path, request_to_json(request))
        try:
            # Off the event loop: a video's MP4 is checked (its packets counted, nothing decoded).
            result = await asyncio.to_thread(answer_from_json, document)
        except BackendUnavailableError as e:
            raise BackendUnavailableError(f"the backend at {self.url}: {e}") from e
        if progress is not None:
            progress(result.request.steps or 1, result.request.steps or 1)
        logger.info(
            "generated on %s in %.2f s (%.2f s there)", self.url, time.perf_counter() - started, result.timings.total
        )
        return result

    async def compare(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: CellProgress | None = None,
    ) -> CompareResult:
        raise InvalidRequestError(
            "comparison grids are not served when this Space is a front end (BACKEND_URL is set); "
            "accepted: /generate, one image at a time"
        )

    async def check(self, spec: LoraSpec) -> LoraCheck:
        return check_from_json(await self._call("POST", "/v1/check", asdict(spec)))

    async def prefetch(self, spec: LoraSpec) -> None:
        """A gallery click: the cluster checks the LoRA, and so prepares it on its pool."""
        await self.check(spec)

    async def status(self) -> tuple[PoolStatus, ...]:
        statuses = []
        for pool in self._pools:
            engine = status_from_json(await self._call("GET", f"/v1/status?base={quote(pool.base_model_id)}"))
            statuses.append(PoolStatus(pool.base_model_id, pool.family, pool.default, None, engine))
        return tuple(statuses)

    def close(self) -> None:
        """Nothing is held between calls (each has its own connection)."""

    async def _call(self, method: str, path: str, document: dict | None = None) -> Any:
        """A JSON answer of the cluster; its errors raised as the tree's classes."""
        try:
            async with httpx.AsyncClient(timeout=self._timeout, transport=self._transport) as client:
                response = await client.request(method, self._url + path, json=document)
        except httpx.HTTPError as e:
            # Not chained: httpx's error holds the request, and so the URL with its credentials.
            raise BackendUnavailableError(
                f"the backend at {self.url} could not be reached ({type(e).__name__}: {_redacted(str(e))}); "
                "try again shortly"
            ) from None
        return self._answer(response)

    def _answer(self, response: httpx.Response) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or body is None:
            raise error_from_body(body, response.status_code)
        return body


def _redacted(text: str) -> str:
    return _USERINFO.sub("***@", text)
