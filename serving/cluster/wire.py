"""What travels between the Space (a front end), the cluster's ingress and its pool replicas, as JSON.

The Space's runner (`serving.backends.remote.RemoteBackend`) sends a whole `GenerateRequest` (several LoRAs, their
revisions, files and scales: more than the `lora` header can say) to the cluster's `POST /v1/generate`,
and gets back the image as lossless PNG with everything else of the `GenerateResult`. Errors travel as the
inference API's JSON (`{"error", "error_type"}`) and become the same class of the one tree again, looked
up by name among its subclasses, so a new error class needs no table here.

No ray, no gradio: both sides import this.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from PIL import Image

from engine.caches.store import CachedAdapter
from engine.errors import BackendUnavailableError, InvalidRequestError, SwitchboardError
from engine.formats.adapters import AdapterKey
from engine.outcomes import EngineStatus, LoraCheck, ServedPool
from engine.requests import (
    AdapterUse,
    CheckedRequest,
    GenerateRequest,
    GenerateResult,
    LoraSpec,
    ModelDefaults,
    Timings,
)

__all__ = [
    "WIRE",
    "Answer",
    "adapter_set_id",
    "check_from_json",
    "decode_png",
    "encode_png",
    "error_body",
    "error_class",
    "error_from_body",
    "pools_from_json",
    "pools_to_json",
    "request_from_json",
    "request_to_json",
    "result_from_json",
    "result_to_json",
    "spec_from_json",
    "status_from_json",
]

T = TypeVar("T")
# The answer form of the Space's `RemoteBackend` (`POST /v1/generate`): JSON with a PNG, rather than a media type.
WIRE = "application/json"


@dataclass(frozen=True)
class Answer:
    """An HTTP answer made on a replica (the image is encoded where it was made), passed on by the ingress."""

    status: int
    media_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


_REQUEST_FIELDS = {f.name for f in fields(GenerateRequest)}
_SPEC_FIELDS = {f.name for f in fields(LoraSpec)}


def request_to_json(request: GenerateRequest) -> dict[str, Any]:
    document = asdict(request)
    document["loras"] = [asdict(spec) for spec in request.loras]
    return document


def request_from_json(document: object) -> GenerateRequest:
    """The request a front end sent; types and ranges are the engine's to check (`normalise_request`)."""
    if not isinstance(document, dict) or set(document) - _REQUEST_FIELDS or "prompt" not in document:
        raise InvalidRequestError(
            f"the request is not a GenerateRequest; accepted: an object with prompt and {sorted(_REQUEST_FIELDS)}"
        )
    loras = document.get("loras") or []
    if not isinstance(loras, list) or not all(isinstance(s, dict) and not set(s) - _SPEC_FIELDS for s in loras):
        raise InvalidRequestError(f"loras is malformed; accepted: a list of objects with fields {sorted(_SPEC_FIELDS)}")
    return GenerateRequest(**{**document, "loras": tuple(LoraSpec(**spec) for spec in loras)})


def adapter_set_id(request: GenerateRequest) -> str:
    """The multiplexed model id of a request: its set of adapter files, whatever their order or scales.

    Scales do not change a prepared adapter, so requests that differ only by scale share a replica's copy.
    Empty for a request without LoRAs (it goes to any replica).
    """
    identities = sorted({(s.ref.strip(), s.revision or "", s.weight_name or "") for s in request.loras})
    return json.dumps(identities, separators=(",", ":")) if identities else ""


def result_to_json(result: GenerateResult) -> dict[str, Any]:
    """Everything of a result but the image, which travels beside it."""
    return {
        "seed": result.seed,
        "request": request_to_json(result.request),
        "timings": asdict(result.timings),
        "adapters": [asdict(use) for use in result.adapters],
        "swapped": result.swapped,
        "warnings": list(result.warnings),
    }


def _checked(request: GenerateRequest) -> CheckedRequest:
    return CheckedRequest(**{f.name: getattr(request, f.name) for f in fields(request)})


def result_from_json(document: Mapping[str, Any], png: bytes) -> GenerateResult:
    try:
        image = Image.open(io.BytesIO(png))
        image.load()
        return GenerateResult(
            image=image,
            seed=int(document["seed"]),
            # The cluster sends back the request it checked: whole numbers, defaults filled, a concrete seed.
            request=_checked(request_from_json(document["request"])),
            timings=Timings(**document["timings"]),
            adapters=tuple(AdapterUse(**use) for use in document["adapters"]),
            swapped=bool(document["swapped"]),
            warnings=tuple(str(w) for w in document["warnings"]),
        )
    except (KeyError, TypeError, ValueError, OSError, InvalidRequestError) as e:
        raise BackendUnavailableError(f"the backend answered a result this Space cannot read: {e}") from e


def encode_png(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_png(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise BackendUnavailableError(f"the backend answered an image this Space cannot read: {e}") from e


def error_body(error: SwitchboardError) -> dict[str, str]:
    """The inference API's error shape: the message and the class name."""
    return {"error": str(error), "error_type": type(error).__name__}


def _subclasses(root: type[SwitchboardError]) -> Iterator[type[SwitchboardError]]:
    yield root
    for sub in root.__subclasses__():
        yield from _subclasses(sub)


def error_class(name: str) -> type[SwitchboardError] | None:
    """The class of the one tree called `name` (every module defining one is imported by then), or None."""
    return next((cls for cls in _subclasses(SwitchboardError) if cls.__name__ == name), None)


def error_from_body(body: object, status: int) -> SwitchboardError:
    """The error a JSON answer stands for: the same class and message; unknown or unreadable: backend trouble."""
    if isinstance(body, dict) and isinstance(body.get("error"), str) and isinstance(body.get("error_type"), str):
        cls = error_class(body["error_type"])
        if cls is not None:
            # Some classes carry more than a message (AmbiguousWeightsError's candidates): build it as a
            # plain exception of that class, so its status, title, message and isinstance checks hold.
            error = cls.__new__(cls)
            Exception.__init__(error, body["error"])
            return error
        return BackendUnavailableError(f"the backend failed with {body['error_type']}: {body['error']}")
    return BackendUnavailableError(f"the backend answered HTTP {status} without a JSON error")


def spec_from_json(document: object) -> LoraSpec:
    if not isinstance(document, dict) or set(document) - _SPEC_FIELDS or "ref" not in document:
        raise InvalidRequestError(f"the LoRA is not a LoraSpec; accepted: an object with fields {sorted(_SPEC_FIELDS)}")
    return LoraSpec(**document)


def check_from_json(document: Mapping[str, Any]) -> LoraCheck:
    return _readable(
        lambda: LoraCheck(
            **{**document, "components": tuple(document["components"]), "warnings": tuple(document["warnings"])}
        )
    )


def pools_to_json(pools: tuple[ServedPool, ...]) -> dict[str, Any]:
    return {"pools": [asdict(pool) for pool in pools]}


def pools_from_json(document: Mapping[str, Any]) -> tuple[ServedPool, ...]:
    """The cluster's pools, the default first; at least one."""

    def build() -> tuple[ServedPool, ...]:
        pools = tuple(
            ServedPool(**{**item, "defaults": ModelDefaults(**item["defaults"])}) for item in document["pools"]
        )
        if not pools:
            raise ValueError("it serves no pool")
        return pools

    return _readable(build)


def status_from_json(document: Mapping[str, Any]) -> EngineStatus:
    def build() -> EngineStatus:
        cached = tuple(CachedAdapter(**{**item, "key": AdapterKey(**item["key"])}) for item in document["cached"])
        return EngineStatus(**{**document, "cached": cached, "applied": tuple(document["applied"])})

    return _readable(build)


def _readable(build: Callable[[], T]) -> T:
    try:
        return build()
    except (KeyError, TypeError, ValueError) as e:
        raise BackendUnavailableError(f"the backend answered something this Space cannot read: {e}") from e
