"""The cluster's front end: the Space's own app over a `ServeBackend`, hosted by Ray Serve.

`Ingress` is Serve's HTTP ingress (`serve.ingress`, its app built once the pools have described themselves): the
same UI, named API, `POST /`, `POST /models/<base>` and `GET /metrics` as one process (`Handlers` over the
backend, `serving.http.api`, `serving.ui.blocks.build_demo`), and the `/v1/*` operations a Space with
`BACKEND_URL` calls (`RemoteBackend`), which go through the same handlers. Routing, seeds, checks, recipes,
errors and how each request ended are the common code's; the cluster adds only the choice of replica. No Ray import
(`serving.cluster.app` wraps it), so the routes are tested without a cluster. The routes in full:
docs/internals.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from engine.errors import GenerationCancelledError, GenerationError, InvalidRequestError, SwitchboardError
from engine.pools.routing import named_pool
from serving.backends.ray_serve import ServeBackend
from serving.cluster.answers import answer_to_json
from serving.cluster.wire import (
    pools_to_json,
    request_from_json,
    spec_from_json,
)
from serving.errors import json_error
from serving.http.api import read_body, unless_disconnected

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from engine.settings import Settings
    from serving.handlers import Handlers

__all__ = ["Ingress", "front_end_app", "wire_routes"]

logger = logging.getLogger(__name__)


class Ingress:
    """Serve's ingress deployment: the front end over the pools' deployments (the default first)."""

    def __init__(
        self,
        pools: Sequence[DeploymentHandle],
        settings: Settings,
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        """`retry_on`: the errors of a replica that died or is unavailable (Ray's, from `serving.cluster.app`)."""
        logging.basicConfig(level=settings.log_level_number)
        self._pools = tuple(pools)
        self._settings = settings
        self._retry_on = retry_on

    async def __serve_build_asgi_app__(self) -> Any:
        """Serve calls this once the replica is up: the pools describe themselves, then the app is built."""
        backend = await ServeBackend.connect(self._pools, self._settings, retry_on=self._retry_on)
        return await asyncio.to_thread(front_end_app, backend, self._settings)


def front_end_app(backend: ServeBackend, settings: Settings) -> Any:
    """The Space's app over `backend`, with the `/v1/*` routes: an ASGI app (Gradio's queue starts in its lifespan)."""
    from serving.handlers import Handlers
    from serving.http.api import http_routes
    from serving.runtime import front_end
    from serving.ui.blocks import build_demo
    from serving.ui.launch import asgi_app

    runtime = front_end(settings, backend)
    handlers = Handlers(backend, runtime.catalog, settings, boot_s=runtime.boot_s)
    demo = build_demo(handlers, hub_url=runtime.hub_url)
    routes = [*wire_routes(handlers), *http_routes(handlers, metrics=settings.metrics)]
    limits = {"max_file_size": settings.max_body_bytes, "max_pixels": settings.max_input_pixels}
    return asgi_app(demo, routes, allowed_paths=[str(d) for d in runtime.local_dirs], **limits)


def wire_routes(handlers: Handlers) -> list[BaseRoute]:
    """`RemoteBackend`'s operations (`serving.cluster.wire`): the pools, a pool's status, a LoRA check, and a
    generation (on a named base's pool, or routed), each through `handlers` as every transport's."""

    async def pools(http: Request, body: bytes) -> Response:
        return JSONResponse(pools_to_json(handlers.pools))

    async def status(http: Request, body: bytes) -> Response:
        base = http.query_params.get("base", "")
        index = named_pool(handlers.pools, base) if base.strip() else 0
        return JSONResponse(_plain((await handlers.status())[index].engine))

    async def check(http: Request, body: bytes) -> Response:
        spec = spec_from_json(_json_body(body, "LoraSpec"))
        return JSONResponse(_plain(await handlers.backend.check(spec)))

    async def generate(http: Request, body: bytes) -> Response:
        document = _json_body(body, "GenerateRequest")
        # Its images counted, then read as far as their headers here (off the event loop); the check decodes them.
        settings = handlers.settings
        request = await asyncio.to_thread(
            request_from_json, document, settings.max_input_pixels, settings.max_reference_images
        )
        base = http.path_params.get("base", "")
        result = await handlers.generate(request, transport="wire", base=base)
        # Off the event loop: a video without its MP4 yet is encoded here.
        return JSONResponse(await asyncio.to_thread(answer_to_json, result))

    # The body limit is the settings' (MAX_BODY_BYTES), as on `POST /`: what a front end accepted travels on.
    limit = handlers.settings.max_body_bytes
    return [
        Route("/v1/pools", _answered(pools, limit), methods=["GET"]),
        Route("/v1/status", _answered(status, limit), methods=["GET"]),
        Route("/v1/check", _answered(check, limit), methods=["POST"]),
        Route("/v1/generate", _answered(generate, limit), methods=["POST"]),
        Route("/v1/models/{base:path}/generate", _answered(generate, limit), methods=["POST"]),
    ]


def _answered(
    route: Callable[[Request, bytes], Awaitable[Response]], limit: int
) -> Callable[[Request], Awaitable[Response]]:
    """The route's answer to the body it was sent (at most `limit` bytes), or its error as the inference API's
    JSON; a client that hangs up first cancels it (the replica's request with it)."""

    async def answer(http: Request) -> Response:
        body = await read_body(http, limit=limit)  # before the disconnect watch, which takes every message after it
        if isinstance(body, Response):
            return body
        try:
            response = await unless_disconnected(http, lambda: route(http, body))
        except SwitchboardError as e:
            return json_error(e)
        except Exception as e:
            # A bug or a library's error: JSON like every other answer (a front end reads it as the tree's class),
            # its own text left in the log beside the id the answer gives.
            return json_error(GenerationError.unforeseen(e, logger, http.url.path))
        if response is None:
            logger.info("%s: the client went away; its request was cancelled", http.url.path)
            return json_error(GenerationCancelledError("the client went away"))
        return response

    return answer


def _json_body(body: bytes, what: str) -> object:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InvalidRequestError(f"the body is not a JSON {what} ({e})") from e


def _plain(value: object) -> object:
    """A dataclass as a JSON-ready dict (asdict recurses into AdapterKey and ModelDefaults too)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
