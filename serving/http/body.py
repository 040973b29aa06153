"""The body of `POST /` (and the cluster ingress's): the inference API's JSON, validated by pydantic models.

`{"inputs": "<prompt>", "parameters": {...}, "options": {...}}`, unknown fields refused at every level;
`parameters.loras` lists `{"path": ..., "scale": ...}` (InferenceClient's shape), each path parsed into its
parts, never fetched as a URL. Every refusal is an InvalidRequestError (400) naming the field, its value and what
is accepted, translated from pydantic in one place (`_refusal`). The fields, in full: docs/internals.md,
"serving/http/body.py".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, ValidationError, create_model

from engine.errors import InvalidRequestError
from engine.images import ACCEPTED_MEDIA_TYPES, encoded_image
from engine.requests import DECLARED_FIELDS, REQUEST_FIELDS, GenerateRequest, LoraSpec
from engine.settings import Settings
from lora_catalog.civitai.refs import SITE_HOSTS, parse_civitai
from serving.http.images import IMAGE_ONLY, TargetSize, image_request, video_request
from serving.video import VideoType, video_media_type

__all__ = ["HUB_HOST", "HttpRequest", "lora_from_path", "parse_body"]

HUB_HOST = "huggingface.co"
_ACCEPTED_PATH = (
    f"a Hub repo id 'owner/name' or a Hub file URL 'https://{HUB_HOST}/<owner>/<name>/resolve/<revision>/<file>' "
    "(or a pair's folder, '.../tree/<revision>/<folder>'); "
    "or a Civitai LoRA ('civitai:<version id>', a https://civitai.com/models/<id> page or "
    "/api/download/models/<version id> link, or an AIR)"
)
_ITEM_SHAPE = '{"path": "<repo id, Hub file URL or Civitai reference>", "scale": <number>}'
_BODY_SHAPE = '{"inputs": "<prompt>", "parameters": {...}}'
# The settings' default; the Space passes its own (`serving.http.api`).
MAX_INPUT_PIXELS: int = Settings.model_fields["max_input_pixels"].default
MAX_VIDEO_FRAMES: int = Settings.model_fields["max_video_frames"].default
_STRING = DECLARED_FIELDS["negative_prompt"].accepts
_SCHEDULER = DECLARED_FIELDS["scheduler"].accepts
_OPTION_VALUE = "a boolean or a string (a scheduler option's value)"


def _whole(value: object) -> object:
    """A float with nothing after the point is an integer (JSON does not tell 20 from 20.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


_Integer = Annotated[int, BeforeValidator(_whole)]


def _joined(value: object) -> object:
    """A list of strings as one, joined by ", ": Hugging Face's text-to-video task (and huggingface_hub's
    `text_to_video`) sends `negative_prompt` as a list; the text-to-image task as a string."""
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return ", ".join(part.strip() for part in value if part.strip())
    return value


_Text = Annotated[str, BeforeValidator(_joined)]


def _option_value(value: object) -> bool | str:
    """A scheduler option's value: a boolean or a string, as sent (the engine checks which)."""
    if not isinstance(value, bool | str):
        raise ValueError("not a boolean or a string")
    return value


_OptionValue = Annotated[bool | str, PlainValidator(_option_value)]
_INTEGER, _NUMBER = DECLARED_FIELDS["steps"].accepts, DECLARED_FIELDS["guidance"].accepts
_SCHEDULE = "a list of [from, scale] pairs: from a fraction of the steps, the first 0, increasing, at most 1"
_FRACTION = "a fraction of the steps, from 0 to 1"
# One [from, scale] pair as JSON carries it (a list: strict models take no list as a tuple).
_Segment = Annotated[list[float], Field(min_length=2, max_length=2)]
# Strict: no string is a number, no boolean is an integer.
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Lora(BaseModel):
    """One entry of `parameters.loras`."""

    model_config = _STRICT

    path: Annotated[str, Field(description=_ACCEPTED_PATH)]
    scale: Annotated[float | None, Field(description=_NUMBER)] = None
    # The low-noise transformer's scale on a two-transformer pool (Wan 2.2 A14B); none: `scale` for both.
    scale_2: Annotated[float | None, Field(description=_NUMBER)] = None
    # Its strength by step (`LoraSpec.schedule`; docs/usage.md): [[from, scale], ...], or `scale` on [start, end).
    schedule: Annotated[list[_Segment] | None, Field(description=_SCHEDULE)] = None
    start: Annotated[float | None, Field(description=_FRACTION)] = None
    end: Annotated[float | None, Field(description=_FRACTION)] = None
    schedule_2: Annotated[list[_Segment] | None, Field(description=_SCHEDULE)] = None


# Each kind of request field as the inference API's JSON carries it (`engine.request_schema`).
_HTTP_TYPES: dict[str, Any] = {
    # A string, or (text-to-video's negative prompt) a list of strings joined into one.
    "text": _Text,
    "integer": _Integer,
    "number": float,
    "loras": list[_Lora],
    "sampler": str,
    "options": dict[str, _OptionValue],
    # base64, with or without a `data:image/...;base64,` prefix (read by `serving.http.images`).
    "image": str,
    # A list of those (`parameters.images`: the further references, counted, then read the same way).
    "images": list[str],
    # An MP4 in base64, with or without a `data:video/mp4;base64,` prefix (`parameters.video`: `video_request`).
    "video": str,
}
# The inference API's own parameters lead the list, as Hugging Face's text-to-image task documents them.
_LEADING = ("num_inference_steps", "guidance_scale")


def _parameters_fields() -> dict[str, Any]:
    """The inference API's parameters from the request's fields (`http` names them; the field each fills is the
    serialization alias), all optional; `lora_scale`, the `lora` header's scale, comes before `loras`."""
    named = {f.http: f for f in REQUEST_FIELDS if f.http is not None}
    order = [*_LEADING, *(name for name in named if name not in _LEADING)]
    out: dict[str, Any] = {}
    for http in order:
        declared = named[http]
        if declared.kind == "loras":
            out["lora_scale"] = (float | None, Field(None, description=_NUMBER))
        # Hugging Face's text-to-image task: "override the scheduler with a compatible one" (a sampler name too).
        accepts = f"a list [{_ITEM_SHAPE}, ...]" if declared.kind == "loras" else declared.accepts
        alias = declared.name if declared.name != http else None
        out[http] = (_HTTP_TYPES[declared.kind] | None, Field(None, description=accepts, serialization_alias=alias))
    # Hugging Face's image-to-image task: the prompt and the output size are parameters there (`inputs` is the
    # image); they fill `prompt`, `width` and `height`.
    out["prompt"] = (str | None, Field(None, description=_STRING))
    out["target_size"] = (TargetSize | None, Field(None, description=TargetSize.__doc__))
    return out


# The inference API's parameters, derived from the request's one declaration.
_Parameters = create_model(
    "_Parameters",
    __config__=_STRICT,
    __doc__="The inference API's parameters; a serialization alias names the GenerateRequest field one fills.",
    **_parameters_fields(),
)


class _Body(BaseModel):
    model_config = _STRICT

    inputs: Annotated[str, Field(description="the prompt as a string or a base64 image")]
    # A model derived at import (mypy sees Any).
    parameters: Annotated[_Parameters | None, Field(description="a JSON object")] = None  # type: ignore[valid-type]
    # Part of the inference API's body (wait_for_model, use_cache); nothing here needs it.
    options: Any = None


@dataclass(frozen=True)
class HttpRequest:
    """A parsed body and headers: the generation request and how to encode the answer."""

    request: GenerateRequest
    media_type: str
    # How a video pool's answer is sent (`serving.video.video_media_type`): MP4 unless Accept prefers an
    # animated WebP or GIF.
    video_type: VideoType = "video/mp4"


def parse_body(
    body: bytes,
    *,
    lora: str | None,
    accept: str | None,
    content_type: str | None = None,
    max_pixels: int = MAX_INPUT_PIXELS,
    most_images: int | None = None,
    max_frames: int = MAX_VIDEO_FRAMES,
) -> HttpRequest:
    """Validate the body and the `lora` header; InvalidRequestError names what is wrong. A body sent as an image
    (`Content-Type: image/png`, `image/jpeg`, `image/webp`) is image-to-image with no prompt and the defaults; a
    JSON body whose `parameters` hold `prompt` is image-to-image from the base64 image in `inputs`
    (`serving.http.images`: `max_pixels` is MAX_INPUT_PIXELS, `most_images` MAX_REFERENCE_IMAGES). Images and a
    reference video (`max_frames`: MAX_VIDEO_FRAMES) are carried as their files, read only as far as their headers:
    the engine's check decodes them."""
    media = (content_type or "").partition(";")[0].strip().lower()
    if media in ACCEPTED_MEDIA_TYPES or media.startswith("image/"):
        image = encoded_image(body, what="the body", max_pixels=max_pixels)
        header = (LoraSpec(lora.strip()),) if lora and lora.strip() else ()
        request = GenerateRequest(prompt="", loras=header, image=image)
        return HttpRequest(request, _media_type(accept), video_media_type(accept))
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequestError(f"the body is not valid JSON ({e}); accepted: {_BODY_SHAPE}") from e
    except RecursionError as e:
        raise InvalidRequestError(f"the body is JSON nested too deeply to read; accepted: {_BODY_SHAPE}") from e
    document = _extra_body_merged(document)
    try:
        parsed = _Body.model_validate(document)
    except ValidationError as e:
        raise _refusal(e) from None
    parameters = parsed.parameters or _Parameters()
    listed = tuple(_spec(item, f"parameters.loras[{index}]") for index, item in enumerate(parameters.loras or ()))
    scale = parameters.lora_scale
    lora = (lora or "").strip()
    if scale is not None and not lora:
        raise InvalidRequestError(
            "lora_scale was given without a LoRA header; accepted: a 'lora' header naming the LoRA it scales "
            "(entries of parameters.loras carry their own scale)"
        )
    header = (LoraSpec(lora, scale=1.0 if scale is None else scale),) if lora else ()
    fields = parameters.model_dump(
        by_alias=True,
        exclude_none=True,
        exclude={"loras", "lora_scale", "scheduler_options", "images", "video", *IMAGE_ONLY},
    )
    options = tuple(sorted((parameters.scheduler_options or {}).items()))
    # Both together: the header's LoRA first, then the list, all within the engine's LoRA limit.
    request = GenerateRequest(prompt=parsed.inputs, loras=header + listed, scheduler_options=options, **fields)
    imaged = video_request(
        image_request(request, parameters, max_pixels, most_images), parameters, max_pixels, max_frames
    )
    return HttpRequest(imaged, _media_type(accept), video_media_type(accept))


def _extra_body_merged(document: Any) -> Any:
    """`parameters.extra_body`'s keys read as parameters: huggingface_hub's `InferenceClient.image_to_image(...,
    extra_body={"images": [...]})` sends its keyword arguments as parameters, `extra_body` among them (2.4). A key
    given both ways is refused by name."""
    parameters = document.get("parameters") if isinstance(document, dict) else None
    extra = parameters.get("extra_body") if isinstance(parameters, dict) else None
    if not isinstance(extra, dict):
        return document
    rest = {k: v for k, v in parameters.items() if k != "extra_body"}  # type: ignore[union-attr]
    twice = sorted(set(rest) & set(extra))
    if twice:
        raise InvalidRequestError(
            f"parameter(s) {', '.join(twice)} given both in parameters and in extra_body; accepted: each once"
        )
    return {**document, "parameters": {**rest, **extra}}


def _spec(item: _Lora, where: str) -> LoraSpec:
    ref, revision, weight_name = lora_from_path(item.path, where=f"{where}.path")
    scale = 1.0 if item.scale is None else item.scale
    return LoraSpec(
        ref,
        scale,
        revision,
        weight_name,
        item.scale_2,
        tuple((f, v) for f, v in item.schedule or ()),
        item.start,
        item.end,
        tuple((f, v) for f, v in item.schedule_2 or ()),
    )


def lora_from_path(path: str, *, where: str = "path") -> tuple[str, str | None, str | None]:
    """(repo id, revision, file) from a repo id or a `https://huggingface.co/<repo>/resolve/<rev>/<file>` URL;
    a Civitai link as its canonical `civitai:<version>` (or `civitai:models/<model>`) with no revision or file.

    Only the URL's parts are used: the file is then fetched the one way every LoRA is (the Hub client and its
    cache, or Civitai's API at the configured endpoint, with the size limit), so no request ever makes the server
    fetch from a host a client chose.
    """
    text = path.strip()
    if "://" not in text:
        # A repo id, a local: file or a Civitai id or AIR; the engine validates it with every other LoRA.
        return text, None, None
    parts = urlsplit(text)
    if (parts.hostname or "").lower().rstrip(".") in SITE_HOSTS:
        try:
            civitai = parse_civitai(text)
        except InvalidRequestError as e:
            raise type(e)(f"{where}: {e}") from e
        if civitai is not None:
            return civitai.canonical, None, None
    refused = f"{where} {path!r} is not accepted ({{}}); accepted: {_ACCEPTED_PATH}"
    # The whole netloc, not the host name: a port or user info is refused too. Host names are case-blind.
    if parts.scheme != "https" or parts.netloc.lower() != HUB_HOST:
        raise InvalidRequestError(
            refused.format(f"only https://{HUB_HOST} URLs are read, not {parts.scheme}://{parts.netloc}")
        )
    if parts.query or parts.fragment:
        raise InvalidRequestError(refused.format("it has a query or a fragment"))
    # A folder's page (`/tree/<revision>/<folder>`) names the high- and low-noise pair in it (lora_catalog.pairs).
    folder = parts.path.split("/")[3:4] == ["tree"]
    segments = parts.path.rstrip("/").split("/") if folder else parts.path.split("/")
    if len(segments) < 6 or segments[0] or segments[3] not in ("resolve", "tree") or not all(segments[1:]):
        raise InvalidRequestError(refused.format("it is not a file URL of a model repo"))
    owner, name, revision, *file = (unquote(s) for s in (segments[1], segments[2], *segments[4:]))
    return f"{owner}/{name}", revision, "/".join(file) + ("/" if folder else "")


def _refusal(error: ValidationError) -> InvalidRequestError:
    """pydantic's refusal in the API's words: unknown keys first (a misspelt key explains the rest), all of
    one object at once; else the first bad value, where it is and what its field accepts."""
    errors = error.errors()
    unknown = [e["loc"] for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        parent = unknown[0][:-1]
        names = ", ".join(sorted(str(loc[-1]) for loc in unknown if loc[:-1] == parent))
        if parent == ():
            return InvalidRequestError(f"unknown field(s) {names}; accepted: {', '.join(_Body.model_fields)}")
        if parent == ("parameters",):
            accepted = ", ".join(_Parameters.model_fields)
            return InvalidRequestError(f"unknown parameter(s) {names}; accepted: {accepted}")
        accepted = ", ".join(_Lora.model_fields)
        return InvalidRequestError(f"{_where(parent)} has unknown key(s) {names}; accepted: {accepted}")
    first = errors[0]
    loc = first["loc"]
    value = None if first["type"] == "missing" else first["input"]
    if loc == ():
        return InvalidRequestError(
            f'the body is a JSON {type(value).__name__}; accepted: an object {{"inputs": "<prompt>", ...}}'
        )
    accepted = _accepted(loc)
    # A value is shown where a plain one was expected; a misplaced structure is only named.
    plain = (_INTEGER, _NUMBER, _STRING, _SCHEDULER, _OPTION_VALUE)
    shown = f"{_json_type(value)} {value!r}" if accepted in plain else _json_type(value)
    return InvalidRequestError(f"{_where(loc)} must be {accepted}, got {shown}")


def _where(loc: tuple[int | str, ...]) -> str:
    """`("parameters", "loras", 0, "path")` as `parameters.loras[0].path`, `("parameters", "seed")` as
    `parameter seed`."""
    if len(loc) == 2 and loc[0] == "parameters" and loc[1] != "loras":
        return f"parameter {loc[1]}"
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _accepted(loc: tuple[int | str, ...]) -> str:
    """What the field at `loc` accepts: its description (an entry of `parameters.loras`: an object)."""
    model: type[BaseModel] = _Body
    accepted = ""
    for part in loc:
        if isinstance(part, int):
            model, accepted = _Lora, f"an object {_ITEM_SHAPE}"
        elif part in model.model_fields:
            accepted = model.model_fields[part].description or "a value"
            model = _Parameters if part == "parameters" else model
        else:
            # A key of `scheduler_options`, the one mapping: its value was refused.
            return _OPTION_VALUE
    return accepted


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
