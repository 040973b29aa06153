"""The catalogue's errors: the only exceptions its callers need to know about.

Each message names the bad value and what is accepted, so the UI can show it
as it is. Library errors (httpx, huggingface_hub, json) are wrapped with
`raise ... from e` and never escape unwrapped.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousWeightsError",
    "CatalogError",
    "GatedLoraError",
    "HeaderError",
    "HubUnreachableError",
    "InvalidRepoIdError",
    "InvalidRequestError",
    "InvalidWeightNameError",
    "LoraNotFoundError",
    "NoSafetensorsError",
    "PickleOnlyError",
    "SnapshotError",
]


class CatalogError(Exception):
    """Base of every error the catalogue raises on purpose."""


class InvalidRequestError(CatalogError, ValueError):
    """An argument is malformed: an unknown sort order, a negative page, a path-like name."""


class InvalidRepoIdError(InvalidRequestError):
    """A LoRA reference is not of the form `owner/name` (or `local:<relative path>`)."""


class InvalidWeightNameError(InvalidRequestError):
    """A named weight file is path-like or is not a `.safetensors` file."""


class LoraNotFoundError(CatalogError, LookupError):
    """The repo, revision, named file or local file does not exist (or is private)."""


class GatedLoraError(CatalogError, PermissionError):
    """The repo is gated: this Space does not serve it."""


class NoSafetensorsError(CatalogError):
    """The repo holds no `.safetensors` file."""


class PickleOnlyError(NoSafetensorsError):
    """The repo holds only pickle weights (`.bin`, `.ckpt`, `.pt`, `.pth`), which are never unpickled."""


class AmbiguousWeightsError(CatalogError):
    """Several `.safetensors` files could be the LoRA and none was named."""

    def __init__(self, message: str, candidates: tuple[str, ...]) -> None:
        super().__init__(message)
        self.candidates = candidates


class HubUnreachableError(CatalogError, ConnectionError):
    """The Hub could not be reached in time, failed (5xx) or answered something unreadable."""


class HeaderError(CatalogError, ValueError):
    """A safetensors header is malformed, lies about its data or the file is truncated."""


class SnapshotError(CatalogError):
    """A catalogue snapshot file is missing, corrupt or of an unknown format version."""
