"""`POST /` and `POST /models/<base>`: text-to-image and image-to-image over plain HTTP, shaped like Hugging
Face's inference API.

The body is JSON whatever its Content-Type (`serving.http.body.parse_body`), but an image's (`image/png`,
`image/jpeg`, `image/webp`: image-to-image with the defaults); a JSON body's `inputs` may be a base64 image
(`serving.http.images`). The `lora` header names a Hub
repo, a `local:` file or a Civitai LoRA, and `parameters.loras` lists more as `{"path", "scale"}`, as
huggingface_hub's InferenceClient sends them. It goes through the handlers into the one queue like every
transport; the answer is the image (JPEG, or PNG when preferred), a video pool's clip (MP4, or the animated
WebP or GIF Accept prefers: `serving.video`) or a JSON error `{"error", "error_type"}`
whose status says whose fault it is. A client that hangs up leaves the queue or cancels its generation. The
headers and examples: README's "Use it" and docs/internals.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import quote

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from engine.errors import (
    GenerationCancelledError,
    GenerationError,
    InvalidRequestError,
    RequestTooLargeError,
    SwitchboardError,
)
from engine.requests import GenerateResult
from engine.settings import Settings
from serving.errors import json_error
from serving.http.body import HUB_HOST, HttpRequest, lora_from_path, parse_body
from serving.recipes import encode_image
from serving.video import answer_type, video_file, with_answer_notes

if TYPE_CHECKING:
    # Typing only: the cluster's ingress reuses this module without the Space's runtime (spaces, the catalogue).
    from engine.pools.scheduler import QueueView
    from serving.handlers import Handlers

__all__ = [
    "HUB_HOST",
    "MAX_BODY_BYTES",
    "HttpRequest",
    "encode_image",
    "http_routes",
    "lora_from_path",
    "lora_header",
    "make_routes",
    "parse_body",
    "read_body",
    "result_headers",
    "unless_disconnected",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The settings' default (the Space reads its own: `make_routes`); the cluster's ingress reads with it.
MAX_BODY_BYTES: int = Settings.model_fields["max_body_bytes"].default
# Characters of a LoRA ref kept as they are in the X-Lora-Cache header (everything in a Hub repo id).
_REF_SAFE = "/:@._-~"


def result_headers(result: GenerateResult, position: int | None = None) -> dict[str, str]:
    """The answer's `X-*` headers: the seed, each phase's seconds, whether each LoRA was cached, the cluster
    replica that made it (on a cluster), and the place the request joined the queue at (when it went through this
    process's scheduler): how many requests went to the GPU before it, the one running counted (0: straight to
    the GPU, 1: next); and the result's warnings."""
    timings = result.timings
    place = {} if position is None else {"X-Queue-Position": str(position)}
    elsewhere = [f"{quote(a.ref, safe=_REF_SAFE)}={quote(a.trained_for)}" for a in result.adapters if a.trained_for]
    trained = {"X-Lora-Trained-For": ",".join(elsewhere)} if elsewhere else {}
    # What ran otherwise than sent (a mask resized to its image, an input the model does not read): a JSON list
    # of strings, ASCII-escaped as a header must be.
    warned = {"X-Warnings": json.dumps(list(result.warnings))} if result.warnings else {}
    replica = {"X-Replica": result.served_by} if result.served_by else {}
    return {
        **place,
        **trained,
        **warned,
        **replica,
        "X-Seed": str(result.seed),
        "X-Timing": (
            f"resolve={timings.resolve:.3f};prepare={timings.prepare:.3f};apply={timings.apply:.3f};"
            f"inference={timings.inference:.3f};total={timings.total:.3f}"
        ),
        # Percent-encoded (RFC 3986): a header is latin-1 on the wire, a local file name may be anything.
        "X-Lora-Cache": ",".join(f"{quote(a.ref, safe=_REF_SAFE)}={a.cache}" for a in result.adapters) or "none",
    }


def lora_header(raw: str | None) -> str | None:
    """The `lora` header as the client meant it: curl and httpx send UTF-8 bytes, Starlette reads latin-1."""
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return raw


async def _watch_disconnect(request: Request, gone: Callable[[], None]) -> None:
    # The body is read already, so the next message can only be the client going away.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone()
            return


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """`work()`, cancelled if the client hangs up first (then None); what it raises is raised as it is. Read the
    body before: the watcher takes every message after it."""
    outcome: T | None = None
    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(_watch_disconnect, request, group.cancel_scope.cancel)
        try:
            outcome = await work()
        except Exception as e:  # raised below, outside the group (which would wrap it in an ExceptionGroup)
            failure = e
        finally:
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return outcome


def make_routes(handlers: Handlers) -> list[BaseRoute]:
    """The routes to add to the server in front of the UI (`POST /` and `POST /models/<base>`; `GET /` stays
    the UI). Each request goes through `handlers.generate`, as the UI's and `gradio_client`'s do."""

    async def generate(request: Request) -> Response:
        base = request.path_params.get("base", "")
        settings = handlers.settings
        body = await read_body(request, limit=settings.max_body_bytes)
        if isinstance(body, Response):
            handlers.report("http", body.status_code)
            return body
        try:
            parsed = await anyio.to_thread.run_sync(_parse, request, body, settings)
        except InvalidRequestError as e:
            handlers.report("http", e.status)
            return json_error(e)
        joined: list[int] = []

        def on_queue(view: QueueView) -> None:
            if not joined:
                joined.append(view.ahead)

        async def attempt() -> GenerateResult | SwitchboardError:
            try:
                return await handlers.generate(parsed.request, on_queue=on_queue, transport="http", base=base)
            except SwitchboardError as e:
                return e
            except Exception as e:
                # Counted (500) by the handlers already; answered as JSON like every other error, never as the
                # server's plain-text 500, and never with the exception's own text: an id the log carries.
                return GenerationError.unforeseen(e, logger, f"POST {request.url.path}")

        # A client that hangs up cancels the request: it leaves the queue, or its run stops at the next step; what
        # is answered then (to nobody) says so.
        outcome = await unless_disconnected(request, attempt)
        if outcome is None:
            outcome = GenerationCancelledError("the client went away")
        if isinstance(outcome, SwitchboardError):
            return _failed(outcome, request.url.path)
        # A video pool's result is a video (MP4, or the animated image Accept prefers); else the image.
        media_type = parsed.video_type if outcome.is_video else parsed.media_type
        data = await anyio.to_thread.run_sync(_encoded, outcome, media_type)
        # What the file changes of the video (a GIF's dropped frames) is said with the result's warnings.
        outcome = with_answer_notes(outcome, media_type)
        position = joined[0] if joined else None
        # (A silent video asked for as WAV is its MP4, which its warnings say.)
        answered = answer_type(outcome, media_type) if outcome.is_video else media_type
        return Response(data, media_type=answered, headers=result_headers(outcome, position))

    return [
        Route("/", generate, methods=["POST"], name="inference_api"),
        Route("/models/{base:path}", generate, methods=["POST"], name="inference_api_base"),
    ]


def _encoded(result: GenerateResult, media_type: str) -> bytes:
    """The answer's file (on a worker thread: encoding a video takes a second or more)."""
    return video_file(result, media_type) if result.is_video else encode_image(result.image, media_type)


def _parse(request: Request, body: bytes, settings: Settings) -> HttpRequest:
    """The body as a request (on a worker thread: a large body's JSON and base64 take milliseconds); its images are
    read as far as their headers, each held to MAX_INPUT_PIXELS, once their count is within MAX_REFERENCE_IMAGES."""
    headers = request.headers
    return parse_body(
        body,
        lora=lora_header(headers.get("lora")),
        accept=headers.get("accept"),
        content_type=headers.get("content-type"),
        max_pixels=settings.max_input_pixels,
        most_images=settings.max_reference_images,
        max_frames=settings.max_video_frames,
    )


def _failed(error: SwitchboardError, path: str) -> Response:
    level = logging.WARNING if error.status < 500 else logging.ERROR
    logger.log(level, "POST %s failed: %s: %s", path, type(error).__name__, error)
    return json_error(error)


async def read_body(request: Request, *, limit: int = MAX_BODY_BYTES) -> bytes | Response:
    """The body, or the 413 answer once it is larger than `limit` (MAX_BODY_BYTES; read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> JSONResponse:
    return json_error(
        RequestTooLargeError(
            f"the body has {size} bytes or more; accepted: at most {limit} bytes (MAX_BODY_BYTES; an image's "
            "base64 is 4/3 of its file)"
        )
    )


def http_routes(handlers: Handlers, *, metrics: bool = False) -> list[BaseRoute]:
    """The routes beside the UI: `POST /` and `POST /models/<base>` always, `GET /metrics` when asked for."""
    from serving.http.metrics import Metrics

    routes = make_routes(handlers)
    if metrics:
        routes = [*routes, *Metrics(handlers.backend).routes()]
        logger.warning("METRICS is on: GET /metrics answers anyone who can reach this server")
    return routes
