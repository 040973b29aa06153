"""What travels between a Space with `BACKEND_URL` (a front end) and the cluster's ingress, as JSON (the ingress
and its replicas pass the engine's own values through Serve).

A front end sends a whole `GenerateRequest` (more than the `lora` header can say) and gets the image back as
lossless PNG with the rest of the `GenerateResult`. A request's images travel as files, the client's own where
there is one (`engine.images.file_of`; else a PNG of the pixels): six photos cross as their bytes and base64's
third, not as PNGs of their pixels. A list of them is counted before any is read, then each is read only as far as
its header (`engine.images.encoded_image`), as on every door; the engine's check decodes them once counted and
weighed (a reference video likewise: `serving.cluster.wire_media`). A checked request (the result's) is decoded
here: its images are what ran. Errors travel as the
inference API's JSON and become the same class of the one tree again, found by name. pydantic validates both
ways: strict models of what a front end sends (unknown fields refused: a 400 naming where, never a 500), and the
cluster's answers read into the engine's dataclasses (one that does not fit is `BackendUnavailableError`). No
ray, no gradio: both sides import this.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import MISSING, asdict, fields
from typing import Annotated, Any, TypeVar

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, Strict, TypeAdapter, ValidationError, create_model

from engine.errors import BackendUnavailableError, InvalidRequestError, SwitchboardError
from engine.image_checks import check_door_count
from engine.images import DEFAULT_MAX_INPUT_PIXELS
from engine.outcomes import EngineStatus, LoraCheck, ServedPool
from engine.requests import AdapterUse, CheckedRequest, GenerateRequest, GenerateResult, LoraSpec, Timings
from serving.cluster.wire_media import ImageJson, VideoJson, image_json, video_json

__all__ = [
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
# The largest checked image a cluster sends back: its output's size, at most MAX_SIDE's ceiling squared.
_CHECKED_PIXELS = 4096 * 4096


def _number(value: object) -> object:
    """A JSON number as sent (an integer stays one); no string, no boolean."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a JSON number")
    return value


_Number = Annotated[float, PlainValidator(_number)]
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
# A schedule as JSON carries it, [[from, scale], ...] (numbers as sent: the engine checks them).
_Schedule = Annotated[tuple[Annotated[tuple[_Number, _Number], Strict(False)], ...], Strict(False)]


class _SpecJson(BaseModel):
    """A LoraSpec on the wire (its fields, tests/cluster/test_wire.py checks)."""

    model_config = _STRICT

    ref: str
    scale: _Number = 1.0
    revision: str | None = None
    weight_name: str | None = None
    scale_2: _Number | None = None
    schedule: _Schedule = ()
    start: _Number | None = None
    end: _Number | None = None
    schedule_2: _Schedule = ()

    def spec(self) -> LoraSpec:
        return LoraSpec(**dict(self))  # its fields are LoraSpec's


class _WireRequest(BaseModel):
    """A GenerateRequest on the wire: its fields are derived from the request's declaration (`_wire_fields`)."""

    model_config = _STRICT

    def request(self, max_pixels: int) -> GenerateRequest:
        return GenerateRequest(**self._values(GenerateRequest, max_pixels))

    def checked(self, max_pixels: int) -> CheckedRequest:
        values = self._values(CheckedRequest, max_pixels)
        values["defaults_from"] = tuple((str(f), str(s)) for f, s in getattr(self, "defaults_from", None) or ())
        values["left_unset"] = tuple(getattr(self, "left_unset", None) or ())
        values["notes"] = tuple(getattr(self, "notes", None) or ())
        return CheckedRequest(**values)

    def _values(self, into: type[GenerateRequest], max_pixels: int) -> dict[str, Any]:
        names = {f.name for f in fields(into)}
        values = {name: getattr(self, name) for name in type(self).model_fields if name in names}
        values["loras"] = tuple(s.spec() for s in getattr(self, "loras", None) or ())
        decode = into is CheckedRequest
        for name in _IMAGE_FIELDS:
            wired = getattr(self, name, None)
            values[name] = wired.image(name, max_pixels, decode=decode) if wired is not None else None
        for name in _IMAGE_LISTS:
            listed = enumerate(getattr(self, name, None) or ())
            values[name] = tuple(wired.image(f"{name}[{i}]", max_pixels, decode=decode) for i, wired in listed)
        video = getattr(self, "reference_video", None)
        values["reference_video"] = None if video is None else video.video("reference_video", max_pixels, decode=decode)
        values["scheduler_options"] = tuple(
            tuple(pair) if isinstance(pair, list) else pair for pair in getattr(self, "scheduler_options", None) or ()
        )
        return values


# Each kind of request field as a front end sends it: numbers as sent (the engine checks them), the scheduler's
# options as [[option, value], ...] (the engine checks names and values: `engine.samplers`).
_WIRE_TYPES: dict[str, Any] = {
    "text": str,
    "integer": _Number,
    "number": _Number,
    "loras": list[_SpecJson],
    "sampler": str,
    "options": list[Any],
    "switch": bool,
    "image": ImageJson,
    "images": list[ImageJson],
    "video": VideoJson,
}
_IMAGE_FIELDS = tuple(f.name for f in fields(GenerateRequest) if f.metadata["request"].kind == "image")
# Lists of images (the further references) cross as a list of what the first image crosses as.
_IMAGE_LISTS = tuple(f.name for f in fields(GenerateRequest) if f.metadata["request"].kind == "images")


def _wire_fields() -> dict[str, Any]:
    """Every request field: required where the request has no default, optional (null) where its default is
    None or empty, else with that default."""
    out: dict[str, Any] = {}
    for declared in fields(GenerateRequest):
        kind = _WIRE_TYPES[declared.metadata["request"].kind]
        if declared.default is MISSING:
            out[declared.name] = (kind, ...)
        elif declared.default in (None, ()):
            out[declared.name] = (kind | None, None)
        else:
            out[declared.name] = (kind, declared.default)
    return out


# Derived from the request's one declaration (tests/cluster/test_wire.py checks them against it).
_RequestJson = create_model("_RequestJson", __base__=_WireRequest, **_wire_fields())
# The request a cluster checked, sent back with its result: what ran, and where its defaults came from.
_CheckedJson = create_model(
    "_CheckedJson",
    __base__=_RequestJson,
    __doc__="The request a cluster checked, sent back with its result: what ran, and where its defaults came from.",
    sampler=(str, ""),
    defaults_from=(list[list[str]] | None, None),
    left_unset=(list[str] | None, None),
    notes=(list[str] | None, None),
)


class _ResultJson(BaseModel):
    """Everything of a GenerateResult but its image, as the cluster answers it."""

    seed: int
    # The cluster sends back the request it checked: whole numbers, defaults filled, a concrete seed.
    request: _CheckedJson  # type: ignore[valid-type]  # derived at import: mypy sees Any
    timings: Timings
    adapters: tuple[AdapterUse, ...]
    swapped: bool
    warnings: tuple[str, ...]
    model_id: str = ""
    served_by: str = ""
    fps: int = 0


class _PoolsJson(BaseModel):
    """The cluster's pools, the default first; at least one."""

    pools: Annotated[tuple[ServedPool, ...], Field(min_length=1)]


_CHECK = TypeAdapter(LoraCheck)
_POOLS = TypeAdapter(_PoolsJson)
_STATUS = TypeAdapter(EngineStatus)


def request_to_json(request: GenerateRequest) -> dict[str, Any]:
    document = asdict(request)
    document["loras"] = [asdict(spec) for spec in request.loras]
    for name in _IMAGE_FIELDS:
        document[name] = image_json(getattr(request, name))
    for name in _IMAGE_LISTS:
        document[name] = [image_json(image) for image in getattr(request, name)]
    document["reference_video"] = video_json(request.reference_video)
    options = request.scheduler_options
    # Pairs as a list of pairs (a mapping, as a caller may give, the same way); the engine checks them.
    document["scheduler_options"] = [list(p) for p in (options.items() if isinstance(options, Mapping) else options)]
    return document


def request_from_json(
    document: object, max_pixels: int = DEFAULT_MAX_INPUT_PIXELS, most_images: int | None = None
) -> GenerateRequest:
    """The request a front end sent; its ranges are the engine's to check (`normalise_request`), its images
    counted (past `most_images`, MAX_REFERENCE_IMAGES, or past what any pool takes: refused unread), then carried as
    their files, each read only as far as its header, within `max_pixels` (MAX_INPUT_PIXELS)."""
    references = document.get("images") if isinstance(document, dict) else None
    # Counted before the JSON's models are even built: a 32 MiB body holds some 73,000 tiny images.
    check_door_count(len(references) if isinstance(references, list) else 0, most_images)
    try:
        return _RequestJson.model_validate(document).request(max_pixels)
    except ValidationError as e:
        raise _refused(e, "GenerateRequest") from None


def spec_from_json(document: object) -> LoraSpec:
    try:
        return _SpecJson.model_validate(document).spec()
    except ValidationError as e:
        raise _refused(e, "LoraSpec") from None


def _refused(error: ValidationError, what: str) -> InvalidRequestError:
    """pydantic's first refusal: where, why and the fields accepted there (a LoRA's within `loras`)."""
    loc = error.errors()[0]["loc"]
    model = _SpecJson if what == "LoraSpec" or "loras" in loc[:-1] else _RequestJson
    accepted = ", ".join(
        f"{name} (required)" if field.is_required() else name for name, field in model.model_fields.items()
    )
    return InvalidRequestError(f"the {what} is refused at {_first(error)}; accepted: an object with fields {accepted}")


def _first(error: ValidationError) -> str:
    """Where the first problem is, what it is and the value found there."""
    first = error.errors()[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]).lstrip(".")
    cause = first.get("ctx", {}).get("error")
    why = str(cause) if cause else "not an object" if first["type"] in ("model_type", "dict_type") else first["msg"]
    found = "" if first["type"] == "missing" else f", got {first['input']!r:.100}"
    return f"{where or 'its top'}: {why}{found}"


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
        "model_id": result.model_id,
        "served_by": result.served_by,
        "fps": result.fps,
    }


def result_from_json(
    document: Mapping[str, Any], png: bytes, more: Sequence[bytes] = (), video: bytes = b""
) -> GenerateResult:
    """A result from its JSON and its images' PNGs (the first, then the rest of a request for several), and a
    video's MP4 (its frames are decoded from it by `serving.video.unpacked`)."""
    try:
        read = _ResultJson.model_validate(document)
        images = [_png(data) for data in (png, *more)]
    except (ValidationError, OSError) as e:
        why = _first(e) if isinstance(e, ValidationError) else str(e)
        raise BackendUnavailableError(f"the backend answered a result this Space cannot read ({why})") from e
    checked: _WireRequest = read.request
    return GenerateResult(
        image=images[0],
        video=video,
        fps=read.fps,
        more_images=tuple(images[1:]),
        seed=read.seed,
        # The images of the request the cluster checked are at its output's size (within MAX_SIDE squared).
        request=checked.checked(_CHECKED_PIXELS),
        timings=read.timings,
        adapters=read.adapters,
        swapped=read.swapped,
        warnings=read.warnings,
        model_id=read.model_id,
        served_by=read.served_by,
    )


def _png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


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


def check_from_json(document: object) -> LoraCheck:
    return _readable(_CHECK, document)


def pools_to_json(pools: tuple[ServedPool, ...]) -> dict[str, Any]:
    return {"pools": [asdict(pool) for pool in pools]}


def pools_from_json(document: object) -> tuple[ServedPool, ...]:
    """The cluster's pools, the default first; at least one."""
    return _readable(_POOLS, document).pools


def status_from_json(document: object) -> EngineStatus:
    return _readable(_STATUS, document)


def _readable(adapter: TypeAdapter[T], document: object) -> T:
    try:
        return adapter.validate_python(document)
    except ValidationError as e:
        raise BackendUnavailableError(f"the backend answered something this Space cannot read ({_first(e)})") from e
