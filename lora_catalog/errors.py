"""The one error tree of LoRA Switchboard, rooted here because every package may import the catalogue.

Each class knows what a transport needs to answer with it: an HTTP `status` and a short `title`. The
transports (`serving.errors`) only translate; nothing keys on class names. Messages name the bad value and
what is accepted, so they are shown as they are. Library errors (httpx, huggingface_hub, json) are wrapped
with `raise ... from e` and never escape unwrapped.

The classes here are shared by the catalogue and the engine (a LoRA that is not found is the same error
whoever finds out); `engine.errors` adds the engine's own under `EngineError`.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AdapterLoadError",
    "AmbiguousWeightsError",
    "CatalogError",
    "CivitaiUnavailableError",
    "ContentPolicyError",
    "DownloadRefusedError",
    "GatedLoraError",
    "HeaderError",
    "HubUnavailableError",
    "InvalidRepoIdError",
    "InvalidRequestError",
    "InvalidWeightNameError",
    "LoraNotFoundError",
    "NoSafetensorsError",
    "NotALoraError",
    "PickleOnlyError",
    "RestrictedLoraError",
    "SnapshotError",
    "SwitchboardError",
]


class SwitchboardError(Exception):
    """Root of every error raised on purpose; `status` and `title` are what a transport answers with."""

    status: ClassVar[int] = 500
    title: ClassVar[str] = "Request failed"


class CatalogError(SwitchboardError):
    """Base of the errors about listing, resolving and reading LoRAs (the catalogue's and the engine's)."""


class InvalidRequestError(CatalogError, ValueError):
    """An argument is malformed: an unknown sort order, a negative page, a path-like name, a bad field."""

    status = 400
    title = "Request refused"


class InvalidRepoIdError(InvalidRequestError):
    """A LoRA reference is not of the form `owner/name` (or `local:<relative path>`)."""


class InvalidWeightNameError(InvalidRequestError):
    """A named weight file is path-like or is not a `.safetensors` file."""


class LoraNotFoundError(CatalogError, LookupError):
    """The repo, revision, named file or local file does not exist (or is private)."""

    status = 404
    title = "LoRA not found"


class GatedLoraError(CatalogError, PermissionError):
    """The repo is gated: this Space does not serve it."""

    status = 403
    title = "Gated LoRA"


class HubUnavailableError(CatalogError, ConnectionError):
    """The Hub could not be reached in time, failed (5xx) or answered something unreadable."""

    status = 503
    title = "Hub unreachable"


class CivitaiUnavailableError(HubUnavailableError):
    """Civitai's API could not be reached in time, failed (5xx) or answered something unreadable."""

    title = "Civitai unreachable"


class NotALoraError(InvalidRequestError):
    """A reference names a checkpoint, an embedding or another kind of model that is not a LoRA."""

    title = "Not a LoRA"


class RestrictedLoraError(GatedLoraError):
    """A LoRA whose download needs a login or early access (Civitai answers 401 / 403, or sends to its login)."""

    title = "Download restricted"


class ContentPolicyError(CatalogError, PermissionError):
    """A LoRA this Space's content policy refuses (Civitai's NSFW rating above `CIVITAI_MAX_NSFW_LEVEL`)."""

    status = 403
    title = "Refused by content policy"


class DownloadRefusedError(CatalogError):
    """The source served something other than what its metadata promised (another hash, more bytes), or sent
    the download to a host outside the allowed ones: nothing of it is kept."""

    status = 502
    title = "Download refused"


class AdapterLoadError(CatalogError):
    """The LoRA's file cannot be used: not safetensors, corrupt, ambiguous, bad values."""

    status = 400
    title = "Request refused"


class NoSafetensorsError(AdapterLoadError):
    """The repo holds no `.safetensors` file."""


class PickleOnlyError(NoSafetensorsError):
    """The repo holds only pickle weights (`.bin`, `.ckpt`, `.pt`, `.pth`), which are never unpickled."""


class AmbiguousWeightsError(AdapterLoadError):
    """Several `.safetensors` files could be the LoRA and none was named."""

    def __init__(self, message: str, candidates: tuple[str, ...]) -> None:
        super().__init__(message)
        self.candidates = candidates

    def __reduce__(self) -> tuple[object, ...]:
        # Keeps the candidates when pickled (a cluster replica's errors reach its front end that way).
        return (type(self), (str(self), self.candidates))


class HeaderError(AdapterLoadError, ValueError):
    """A safetensors header is malformed, lies about its data or the file is truncated."""


class SnapshotError(CatalogError):
    """A catalogue snapshot file is missing, corrupt or of an unknown format version."""
