"""Civitai references: every form a user pastes, parsed into one model version (or one model) before any network use.

Accepted (`parse_civitai`): `civitai:<version>`, `civitai:models/<model>`, a civitai.com model page or download
link, and an AIR (`urn:air:<ecosystem>:<type>:civitai:<model>[@<version>]`). Only the parts are read: nothing is
ever fetched from a URL a client gave. A link carrying a `token` is refused without echoing it.
Every form, in full: docs/internals.md, "lora_catalog/civitai/refs.py".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from ..errors import InvalidRequestError, NotALoraError

__all__ = ["CIVITAI_PREFIX", "SITE_HOSTS", "CivitaiRef", "is_civitai_ref", "parse_civitai"]

CIVITAI_PREFIX = "civitai:"
# Civitai's own sites (civitai.green is its safe-for-work domain, civitai.red the other); a link to any of them
# names the same ids. Only parsed, never fetched.
SITE_HOSTS = ("civitai.com", "www.civitai.com", "civitai.green", "civitai.red")
# Civitai's ids are Postgres int4 (its API bounds them the same way: src/pages/api/v1/models/[id].ts).
_MAX_ID = 2_147_483_647
_ID = r"([1-9][0-9]{0,9})"
_CANONICAL_VERSION = re.compile(rf"^civitai:{_ID}$", re.IGNORECASE)
_CANONICAL_MODEL = re.compile(rf"^civitai:models/{_ID}$", re.IGNORECASE)
# urn:air:{ecosystem}:{type}:{source}:{id}[@{version}][+{fileId}][.{format}] (developer.civitai.com/site/guide/air).
_AIR = re.compile(
    r"^(?:urn:)?(?:air:)?(?:(?P<ecosystem>[a-z0-9_.-]+):)?(?:(?P<type>[a-z0-9_-]+):)?civitai:"
    rf"{_ID}(?:@{_ID})?(?P<file>\+[0-9]+)?(?:\.(?P<format>[a-z0-9_]+))?$",
    re.IGNORECASE,
)
_MODEL_PATH = re.compile(rf"^/models/{_ID}(?:/[^/]*)?/?$")
_DOWNLOAD_PATH = re.compile(rf"^/api/download/models/{_ID}/?$")
# AIR types that are not LoRAs (Civitai's ModelType as AIR names it); any other type is left to the API.
_NOT_LORA_TYPES = {
    "checkpoint": "a checkpoint",
    "model": "a checkpoint",
    "embedding": "an embedding",
    "vae": "a VAE",
    "controlnet": "a ControlNet",
    "upscaler": "an upscaler",
    "hypernet": "a hypernetwork",
}
# The query keys Civitai's own download links carry (file choice); this Space takes the primary .safetensors file.
_DOWNLOAD_KEYS = {"type", "format", "size", "fp"}
_PICKLE_FORMATS = {"ckpt", "pickletensor", "pt", "pth", "bin"}
ACCEPTED = (
    "'civitai:<version id>', 'civitai:models/<model id>', a Civitai model page "
    "'https://civitai.com/models/<id>[/<slug>][?modelVersionId=<version id>]', a download link "
    "'https://civitai.com/api/download/models/<version id>' or an AIR 'urn:air:<ecosystem>:lora:civitai:<model id>"
    "[@<version id>]'"
)


@dataclass(frozen=True)
class CivitaiRef:
    """One Civitai model version, or a model (its latest published version) when `version_id` is None."""

    model_id: int | None = None
    version_id: int | None = None

    def __post_init__(self) -> None:
        if self.version_id is None and self.model_id is None:
            raise InvalidRequestError(f"a Civitai reference names no model or version; accepted: {ACCEPTED}")

    @property
    def canonical(self) -> str:
        """The one string for it: the version id when one is named (it is the identity), else the model id."""
        if self.version_id is not None:
            return f"{CIVITAI_PREFIX}{self.version_id}"
        return f"{CIVITAI_PREFIX}models/{self.model_id}"


def is_civitai_ref(text: str) -> bool:
    """Whether `text` is a canonical Civitai ref (what `parse_civitai(...).canonical` gives)."""
    return bool(_CANONICAL_VERSION.match(text) or _CANONICAL_MODEL.match(text))


def parse_civitai(value: object) -> CivitaiRef | None:
    """The Civitai version or model `value` names; None when it is not Civitai-shaped at all (a Hub repo id, a
    local file, another host's URL); InvalidRequestError (or NotALoraError) naming it when it is, but wrong."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    lowered = text.lower()
    if lowered.startswith(CIVITAI_PREFIX):
        return _canonical(text, value)
    if "://" in text:
        return _url(text, value)
    if ":civitai:" in lowered or lowered.startswith(("urn:air:", "air:")):
        return _air(text, value)
    return None


def _canonical(text: str, original: str) -> CivitaiRef:
    if match := _CANONICAL_VERSION.match(text):
        return CivitaiRef(version_id=_id(match.group(1), original))
    if match := _CANONICAL_MODEL.match(text):
        return CivitaiRef(model_id=_id(match.group(1), original))
    raise InvalidRequestError(f"Civitai reference {original!r} is not accepted; accepted: {ACCEPTED}")


def _air(text: str, original: str) -> CivitaiRef:
    match = _AIR.match(text)
    if match is None:
        raise InvalidRequestError(f"AIR {original!r} is not a Civitai AIR this Space reads; accepted: {ACCEPTED}")
    # With one segment before the source it may be either the ecosystem or the type: both are looked at.
    kinds = [(match.group(name) or "").lower() for name in ("type", "ecosystem")]
    if kind := next((k for k in kinds if k in _NOT_LORA_TYPES), None):
        raise NotALoraError(f"AIR {original!r} names {_NOT_LORA_TYPES[kind]}, not a LoRA; accepted: {ACCEPTED}")
    if match.group("file"):
        raise InvalidRequestError(
            f"AIR {original!r} names a file ({match.group('file')}); accepted: an AIR without '+<file id>' (the "
            "version's primary .safetensors file is used)"
        )
    if (match.group("format") or "").lower() in _PICKLE_FORMATS:
        raise InvalidRequestError(
            f"AIR {original!r} names a pickle format, which is never unpickled; accepted: an AIR of a .safetensors "
            "file (format safetensor, or none)"
        )
    model, version = match.group(3), match.group(4)
    return CivitaiRef(_id(model, original), _id(version, original) if version else None)


def _url(text: str, original: str) -> CivitaiRef | None:
    parts = urlsplit(text)
    host = (parts.hostname or "").lower().rstrip(".")
    if host not in SITE_HOSTS:
        return None
    shown = _redacted(text)
    refused = f"Civitai link {shown!r} is not accepted ({{}}); accepted: {ACCEPTED}"
    try:
        port = parts.port
    except ValueError:
        port = -1  # not a number: refused below like any port
    if parts.scheme.lower() != "https" or parts.username or parts.password or port is not None:
        raise InvalidRequestError(refused.format("only https:// links without a port or user are read"))
    query = parse_qsl(parts.query, keep_blank_values=True)
    keys = {key for key, _ in query}
    if "token" in keys:
        raise InvalidRequestError(refused.format("it carries a token; paste the link without it"))
    if match := _MODEL_PATH.match(parts.path):
        if keys - {"modelVersionId"}:
            raise InvalidRequestError(refused.format(f"unknown query key(s) {', '.join(sorted(keys))}"))
        versions = [v for key, v in query if key == "modelVersionId"]
        if len(versions) > 1:
            raise InvalidRequestError(refused.format("it names modelVersionId twice"))
        version = _id(versions[0], original) if versions else None
        return CivitaiRef(_id(match.group(1), original), version)
    if match := _DOWNLOAD_PATH.match(parts.path):
        if keys - _DOWNLOAD_KEYS:
            unknown = ", ".join(sorted(keys - _DOWNLOAD_KEYS))
            raise InvalidRequestError(refused.format(f"unknown query key(s) {unknown}"))
        return CivitaiRef(version_id=_id(match.group(1), original))
    raise InvalidRequestError(refused.format("it is not a model page or a download link"))


def _id(text: str, original: str) -> int:
    number = int(text) if text.isdigit() else 0
    if not 1 <= number <= _MAX_ID:
        raise InvalidRequestError(
            f"Civitai reference {_redacted(original)!r} holds the id {text!r}; accepted: ids from 1 to {_MAX_ID}"
        )
    return number


def _redacted(text: str) -> str:
    """`text` with the value of any `token=` query parameter hidden (a pasted link may carry someone's key)."""
    return re.sub(r"(?i)([?&]token=)[^&#]*", r"\1***", text)
