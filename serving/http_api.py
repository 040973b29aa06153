"""`POST /`: text-to-image over plain HTTP, shaped like Hugging Face's inference API.

    curl -H 'lora: minimaxir/sdxl-wrong-lora' http://localhost:7860 \\
         -d '{"inputs": "elephant", "parameters": {"num_inference_steps": 20}}' > result.jpg

The body is JSON whatever its Content-Type says (curl's `-d` sends a form type).
The `lora` header names a Hub repo id or a `local:` file; the answer is the image
(JPEG, or PNG when `Accept` prefers `image/png`), or a JSON error
`{"error": message, "error_type": class name}` with a status that says whose
fault it is. Generation runs in a worker thread on the same engine (and lock)
as the UI; a client that hangs up cancels its request.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote

import anyio
from PIL.Image import Image
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from engine.errors import InvalidRequestError, RequestTooLargeError, SwitchboardError
from engine.requests import GenerateRequest, GenerateResult, LoraSpec

from .errors import json_error
from .runtime import GpuRunner

__all__ = ["ACCEPTED_PARAMETERS", "MAX_BODY_BYTES", "HttpRequest", "make_routes", "parse_body"]

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
    fields = _parameters(parameters)
    scale = fields.pop("lora_scale", None)
    lora = (lora or "").strip()
    if scale is not None and not lora:
        raise InvalidRequestError("lora_scale was given without a LoRA; accepted: a 'lora' header naming one")
    loras = (LoraSpec(lora, scale=1.0 if scale is None else float(scale)),) if lora else ()
    request = GenerateRequest(prompt=prompt, loras=loras, **fields)
    return HttpRequest(request=request, media_type=_media_type(accept))


def _parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(parameters) - set(ACCEPTED_PARAMETERS))
    if unknown:
        raise InvalidRequestError(
            f"unknown parameter(s) {', '.join(unknown)}; accepted: {', '.join(ACCEPTED_PARAMETERS)}"
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


def _encode(image: Image, media_type: str) -> bytes:
    buffer = io.BytesIO()
    if media_type == "image/png":
        image.save(buffer, format="PNG")
    else:
        image.convert("RGB").save(buffer, format="JPEG", quality=_JPEG_QUALITY)
    return buffer.getvalue()


def _headers(result: GenerateResult) -> dict[str, str]:
    timings = result.timings
    return {
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


async def _watch_disconnect(request: Request, cancel: threading.Event) -> None:
    # The body is read already, so the next message can only be the client going away.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def make_routes(runner: GpuRunner) -> list[BaseRoute]:
    """The routes to add to the server in front of the UI (only `POST /`: `GET /` stays the UI)."""

    async def generate(request: Request) -> Response:
        body = await _read_body(request)
        if isinstance(body, Response):
            return body
        try:
            parsed = parse_body(
                body, lora=_lora_header(request.headers.get("lora")), accept=request.headers.get("accept")
            )
        except InvalidRequestError as e:
            return json_error(e)
        cancel = threading.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(_watch_disconnect, request, cancel)
            outcome: GenerateResult | SwitchboardError
            try:
                outcome = await anyio.to_thread.run_sync(partial(runner.generate, parsed.request, cancel=cancel))
            except SwitchboardError as e:
                outcome = e
            finally:
                group.cancel_scope.cancel()
        if isinstance(outcome, SwitchboardError):
            level = logging.WARNING if outcome.status < 500 else logging.ERROR
            logger.log(level, "POST / failed: %s: %s", type(outcome).__name__, outcome)
            return json_error(outcome)
        data = await anyio.to_thread.run_sync(_encode, outcome.image, parsed.media_type)
        return Response(data, media_type=parsed.media_type, headers=_headers(outcome))

    return [Route("/", generate, methods=["POST"], name="inference_api")]


async def _read_body(request: Request) -> bytes | Response:
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
