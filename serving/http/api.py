"""`POST /`: text-to-image over plain HTTP, shaped like Hugging Face's inference API.

    curl -H 'lora: minimaxir/sdxl-wrong-lora' http://localhost:7860 \\
         -d '{"inputs": "elephant", "parameters": {"num_inference_steps": 20}}' > result.jpg

`POST /models/<base repo id>` takes the same body and headers and generates on that base's pool (like
the inference API's URL form); an unserved base is a 404 naming the served ones. Without it a request
goes to its LoRAs' pool (the base they were made for), or the default one.

The body is JSON whatever its Content-Type says (curl's `-d` sends a form type).
The `lora` header names a Hub repo id or a `local:` file; `parameters.loras` lists more as
`{"path": ..., "scale": ...}` (the shape huggingface_hub's InferenceClient sends to text-to-image
providers), each path a repo id or a `https://huggingface.co/<repo>/resolve/<revision>/<file>` URL,
parsed into its parts (nothing is fetched from the URL itself). The answer is the image
(JPEG, or PNG when `Accept` prefers `image/png`), or a JSON error
`{"error": message, "error_type": class name}` with a status that says whose
fault it is. The request goes through the handlers (`serving.handlers`) like the UI's and
`gradio_client`'s, into the one queue: a full queue answers 503 with `Retry-After`; a queued
request holds no worker thread. `X-Queue-Position` says where it joined (absent when a cluster
queued it). A client that hangs up leaves the queue, or cancels its generation.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

import anyio
from PIL.Image import Image
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from engine.errors import GenerationCancelledError, InvalidRequestError, RequestTooLargeError, SwitchboardError
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from serving.errors import json_error

if TYPE_CHECKING:
    # Typing only: the cluster's ingress reuses this module without the Space's runtime (spaces, the catalogue).
    from engine.pools.scheduler import QueueView
    from serving.handlers import Handlers

__all__ = [
    "ACCEPTED_PARAMETERS",
    "HUB_HOST",
    "MAX_BODY_BYTES",
    "HttpRequest",
    "encode_image",
    "http_routes",
    "lora_from_path",
    "make_routes",
    "parse_body",
    "read_body",
    "result_headers",
]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
_JPEG_QUALITY = 92
# Characters of a LoRA ref kept as they are in the X-Lora-Cache header (everything in a Hub repo id).
_REF_SAFE = "/:@._-~"
# Inference-API name -> (GenerateRequest field, accepted JSON types, how to describe them).
ACCEPTED_PARAMETERS: Mapping[str, tuple[str, tuple[type, ...], str]] = {
    "num_inference_steps": ("steps", (int,), "an integer"),
    "guidance_scale": ("guidance", (int, float), "a number"),
    "negative_prompt": ("negative_prompt", (str,), "a string"),
    "width": ("width", (int,), "an integer"),
    "height": ("height", (int,), "an integer"),
    "seed": ("seed", (int,), "an integer"),
    "lora_scale": ("lora_scale", (int, float), "a number"),
}
# `options` is part of the inference API's body (wait_for_model, use_cache); nothing here needs it.
_TOP_LEVEL = ("inputs", "parameters", "options")
# `parameters.loras`: what InferenceClient's providers take (fal.ai's shape); only Hub files, parsed, never fetched.
_LORAS = "loras"
_LORA_KEYS = ("path", "scale")
HUB_HOST = "huggingface.co"
_ACCEPTED_PATH = (
    f"a Hub repo id 'owner/name' or a Hub file URL 'https://{HUB_HOST}/<owner>/<name>/resolve/<revision>/<file>'"
)


@dataclass(frozen=True)
class HttpRequest:
    """A parsed body and headers: the generation request and how to encode the answer."""

    request: GenerateRequest
    media_type: str


def parse_body(body: bytes, *, lora: str | None, accept: str | None) -> HttpRequest:
    """Validate the JSON body and the `lora` header; InvalidRequestError names what is wrong."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequestError(
            f'the body is not valid JSON ({e}); accepted: {{"inputs": "<prompt>", "parameters": {{...}}}}'
        ) from e
    except RecursionError as e:
        raise InvalidRequestError(
            'the body is JSON nested too deeply to read; accepted: {"inputs": "<prompt>", "parameters": {...}}'
        ) from e
    if not isinstance(document, dict):
        raise InvalidRequestError(
            f'the body is a JSON {type(document).__name__}; accepted: an object {{"inputs": "<prompt>", ...}}'
        )
    unknown = sorted(set(document) - set(_TOP_LEVEL))
    if unknown:
        raise InvalidRequestError(f"unknown field(s) {', '.join(unknown)}; accepted: {', '.join(_TOP_LEVEL)}")
    prompt = document.get("inputs")
    if not isinstance(prompt, str):
        raise InvalidRequestError(f"inputs must be the prompt as a string, got {_json_type(prompt)}")
    parameters = document.get("parameters")
    parameters = {} if parameters is None else parameters
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"parameters must be a JSON object, got {_json_type(parameters)}")
    listed = _loras(parameters.get(_LORAS))
    fields = _parameters({k: v for k, v in parameters.items() if k != _LORAS})
    scale = fields.pop("lora_scale", None)
    lora = (lora or "").strip()
    if scale is not None and not lora:
        raise InvalidRequestError(
            "lora_scale was given without a LoRA header; accepted: a 'lora' header naming the LoRA it scales "
            "(entries of parameters.loras carry their own scale)"
        )
    header = (LoraSpec(lora, scale=1.0 if scale is None else float(scale)),) if lora else ()
    # Both together: the header's LoRA first, then the list, all within the engine's LoRA limit.
    request = GenerateRequest(prompt=prompt, loras=header + listed, **fields)
    return HttpRequest(request=request, media_type=_media_type(accept))


def _loras(value: object) -> tuple[LoraSpec, ...]:
    """`parameters.loras`: a list of `{"path": ..., "scale": ...}`; the count is checked with the rest later."""
    if value is None:
        return ()
    item_shape = '{"path": "<repo id or Hub file URL>", "scale": <number>}'
    shape = f"[{item_shape}, ...]"
    if not isinstance(value, list):
        raise InvalidRequestError(f"parameters.loras must be a list {shape}, got {_json_type(value)}")
    specs = []
    for index, item in enumerate(value):
        where = f"parameters.loras[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where} must be an object {item_shape}, got {_json_type(item)}")
        unknown = sorted(set(item) - set(_LORA_KEYS))
        if unknown:
            raise InvalidRequestError(f"{where} has unknown key(s) {', '.join(unknown)}; accepted: path, scale")
        path, scale = item.get("path"), item.get("scale")
        if not isinstance(path, str):
            raise InvalidRequestError(f"{where}.path must be {_ACCEPTED_PATH}, got {_json_type(path)}")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float)):
            raise InvalidRequestError(f"{where}.scale must be a number, got {_json_type(scale)} {scale!r}")
        ref, revision, weight_name = lora_from_path(path, where=f"{where}.path")
        specs.append(LoraSpec(ref, 1.0 if scale is None else float(scale), revision, weight_name))
    return tuple(specs)


def lora_from_path(path: str, *, where: str = "path") -> tuple[str, str | None, str | None]:
    """(repo id, revision, file) from a repo id or a `https://huggingface.co/<repo>/resolve/<rev>/<file>` URL.

    Only the URL's parts are used: the file is then fetched the one way every LoRA is (the Hub client and its
    cache, with its size limit), so no request ever makes the server fetch from a host a client chose.
    """
    text = path.strip()
    if "://" not in text:
        # A repo id (or a local: file, as in the header); the engine validates it with every other LoRA.
        return text, None, None
    refused = f"{where} {path!r} is not accepted ({{}}); accepted: {_ACCEPTED_PATH}"
    parts = urlsplit(text)
    # The whole netloc, not the host name: a port or user info is refused too. Host names are case-blind.
    if parts.scheme != "https" or parts.netloc.lower() != HUB_HOST:
        raise InvalidRequestError(
            refused.format(f"only https://{HUB_HOST} URLs are read, not {parts.scheme}://{parts.netloc}")
        )
    if parts.query or parts.fragment:
        raise InvalidRequestError(refused.format("it has a query or a fragment"))
    segments = parts.path.split("/")
    if len(segments) < 6 or segments[0] or segments[3] != "resolve" or not all(segments[1:]):
        raise InvalidRequestError(refused.format("it is not a file URL of a model repo"))
    owner, name, revision, *file = (unquote(s) for s in (segments[1], segments[2], *segments[4:]))
    return f"{owner}/{name}", revision, "/".join(file)


def _parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(parameters) - set(ACCEPTED_PARAMETERS))
    if unknown:
        raise InvalidRequestError(
            f"unknown parameter(s) {', '.join(unknown)}; accepted: {', '.join((*ACCEPTED_PARAMETERS, _LORAS))}"
        )
    fields: dict[str, Any] = {}
    for name, value in parameters.items():
        field, types, description = ACCEPTED_PARAMETERS[name]
        if value is None:
            continue
        # JSON has one number type: 20.0 is an acceptable integer, true is not a number.
        if int in types and float not in types and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, types):
            raise InvalidRequestError(f"parameter {name} must be {description}, got {_json_type(value)} {value!r}")
        fields[field] = value
    return fields


def _media_type(accept: str | None) -> str:
    """PNG when the client ranks image/png above image/jpeg, JPEG otherwise."""
    quality = {"image/png": 0.0, "image/jpeg": 0.0}
    for part in (accept or "").split(","):
        media, _, params = part.strip().partition(";")
        media = media.strip().lower()
        if media not in quality:
            continue
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        quality[media] = max(quality[media], q)
    return "image/png" if quality["image/png"] > quality["image/jpeg"] else "image/jpeg"


def _json_type(value: object) -> str:
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string"}
    return names.get(type(value), "array" if isinstance(value, list) else "object")


def encode_image(image: Image, media_type: str) -> bytes:
    """The image as the answer's bytes: PNG, or JPEG at a fixed quality (the same bytes for the same image)."""
    buffer = io.BytesIO()
    if media_type == "image/png":
        image.save(buffer, format="PNG")
    else:
        image.convert("RGB").save(buffer, format="JPEG", quality=_JPEG_QUALITY)
    return buffer.getvalue()


def result_headers(result: GenerateResult, position: int | None = None) -> dict[str, str]:
    """The answer's `X-*` headers: the seed, each phase's seconds, whether each LoRA was cached, and the place
    the request joined the queue at (when it went through this process's scheduler)."""
    timings = result.timings
    place = {} if position is None else {"X-Queue-Position": str(position)}
    return {
        **place,
        "X-Seed": str(result.seed),
        "X-Timing": (
            f"resolve={timings.resolve:.3f};prepare={timings.prepare:.3f};apply={timings.apply:.3f};"
            f"inference={timings.inference:.3f};total={timings.total:.3f}"
        ),
        # Percent-encoded (RFC 3986): a header is latin-1 on the wire, a local file name may be anything.
        "X-Lora-Cache": ",".join(f"{quote(a.ref, safe=_REF_SAFE)}={a.cache}" for a in result.adapters) or "none",
    }


def _lora_header(raw: str | None) -> str | None:
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


def make_routes(handlers: Handlers) -> list[BaseRoute]:
    """The routes to add to the server in front of the UI (`POST /` and `POST /models/<base>`; `GET /` stays
    the UI). Each request goes through `handlers.generate`, as the UI's and `gradio_client`'s do."""

    async def generate(request: Request) -> Response:
        base = request.path_params.get("base", "")
        body = await read_body(request)
        if isinstance(body, Response):
            handlers.report("http", body.status_code)
            return body
        try:
            parsed = parse_body(
                body, lora=_lora_header(request.headers.get("lora")), accept=request.headers.get("accept")
            )
        except InvalidRequestError as e:
            handlers.report("http", e.status)
            return json_error(e)
        joined: list[int] = []

        def on_queue(view: QueueView) -> None:
            if not joined:
                joined.append(view.position)

        # What is answered (to nobody) if the client hangs up first: its request was cancelled with it.
        outcome: GenerateResult | SwitchboardError = GenerationCancelledError("the client went away")
        async with anyio.create_task_group() as group:
            # A client that hangs up cancels the request: it leaves the queue, or its run stops at the next step.
            group.start_soon(_watch_disconnect, request, group.cancel_scope.cancel)
            try:
                outcome = await handlers.generate(parsed.request, on_queue=on_queue, transport="http", base=base)
            except SwitchboardError as e:
                outcome = e
            finally:
                group.cancel_scope.cancel()
        if isinstance(outcome, SwitchboardError):
            return _failed(outcome, request.url.path)
        data = await anyio.to_thread.run_sync(encode_image, outcome.image, parsed.media_type)
        position = joined[0] if joined else None
        return Response(data, media_type=parsed.media_type, headers=result_headers(outcome, position))

    return [
        Route("/", generate, methods=["POST"], name="inference_api"),
        Route("/models/{base:path}", generate, methods=["POST"], name="inference_api_base"),
    ]


def _failed(error: SwitchboardError, path: str) -> Response:
    level = logging.WARNING if error.status < 500 else logging.ERROR
    logger.log(level, "POST %s failed: %s: %s", path, type(error).__name__, error)
    return json_error(error)


async def read_body(request: Request) -> bytes | Response:
    """The body, or the 413 answer once it is larger than MAX_BODY_BYTES (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return _too_large(int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return _too_large(size)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int) -> JSONResponse:
    return json_error(
        RequestTooLargeError(f"the body has {size} bytes or more; accepted: at most {MAX_BODY_BYTES} bytes")
    )


def http_routes(handlers: Handlers, *, metrics: bool = False) -> list[BaseRoute]:
    """The routes beside the UI: `POST /` and `POST /models/<base>` always, `GET /metrics` when asked for."""
    from serving.http.metrics import Metrics

    routes = make_routes(handlers)
    if metrics:
        routes = [*routes, *Metrics(handlers.backend).routes()]
        logger.warning("METRICS is on: GET /metrics answers anyone who can reach this server")
    return routes
