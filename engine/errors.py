"""The engine's errors: its own branch of the one tree (`lora_catalog.errors`), and the shared classes.

Each message names the bad value and what is accepted; each class carries its HTTP status and title, which
`serving.errors` turns into a `gr.Error` or a JSON answer. Nothing in the engine raises library errors
unwrapped.
"""

from __future__ import annotations

import logging
import secrets
from typing import Self

from lora_catalog.errors import (
    AdapterLoadError,
    GatedLoraError,
    HubUnavailableError,
    InvalidRequestError,
    LoraNotFoundError,
    SwitchboardError,
)

__all__ = [
    "FAILED",
    "AdapterLoadError",
    "BackendUnavailableError",
    "EngineBusyError",
    "EngineError",
    "GatedLoraError",
    "GenerationCancelledError",
    "GenerationError",
    "GpuQuotaError",
    "GpuUnavailableError",
    "HubUnavailableError",
    "IncompatibleLoraError",
    "InvalidRequestError",
    "LimitExceededError",
    "LoraNotFoundError",
    "PoolLoadingError",
    "PreparationError",
    "RequestTooLargeError",
    "SettingsError",
    "StorageError",
    "SwitchboardError",
    "UnservedBaseError",
    "UnsupportedLoraVariantError",
]

# What every door answers for a failure nobody foresaw, with the request id the log carries (`EngineError.unforeseen`).
FAILED = "the request failed"


class EngineError(SwitchboardError):
    """Base of the errors only the engine raises."""

    @classmethod
    def unforeseen(cls, error: BaseException, log: logging.Logger, what: str) -> Self:
        """The answer to a failure nobody foresaw (a library's exception, a bug): this class (a 500 one) saying only
        "the request failed (request id ID)", never the exception's own text, which may hold a path, a URL or a
        library's internals. The log (`log`, at ERROR) carries the same id beside what failed (`what`) and the
        exception with its traceback, so whoever is given the id finds the cause. Made once, where the failure is
        first caught: the error then crosses every door (and the cluster's wire) with its text, so its id, unchanged."""
        request_id = secrets.token_hex(6)
        log.error("%s failed unexpectedly (request id %s)", what, request_id, exc_info=error)
        return cls(f"{FAILED} (request id {request_id})")


class SettingsError(EngineError, ValueError):
    """An environment variable holds a value the engine does not accept."""

    title = "Bad configuration"


class LimitExceededError(InvalidRequestError):
    """A request or an adapter goes past a configured limit."""


class RequestTooLargeError(LimitExceededError):
    """A request body is larger than the transport reads."""

    status = 413


class IncompatibleLoraError(EngineError):
    """The LoRA was made for another base model, or its tensors do not fit this one."""

    status = 400
    title = "Incompatible LoRA"


class UnsupportedLoraVariantError(IncompatibleLoraError):
    """The file is a LoRA variant (OFT, IA3, ...) that the fused swap cannot apply."""

    title = "Unsupported LoRA variant"


class EngineBusyError(EngineError):
    """The queue is full: try again shortly (after `retry_after_s`, the HTTP answer's `Retry-After`)."""

    status = 503
    title = "Busy"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[object, ...]:
        # Keeps the hint when the error is pickled (ZeroGPU's worker sends errors back that way).
        return (type(self), (str(self), self.retry_after_s))


class PoolLoadingError(EngineBusyError):
    """The pool a request goes to is still loading (the offline demo loads some in the background once its page is
    up): nothing failed, and the same request succeeds once it serves (after `retry_after_s`, the `Retry-After`)."""

    title = "Loading"


class GenerationError(EngineError, RuntimeError):
    """The pipeline failed while generating (including running out of memory)."""

    title = "Generation failed"


class PreparationError(EngineError, RuntimeError):
    """Preparing an adapter failed in a way no other class describes (a library's unexpected error)."""

    title = "Preparation failed"


class GenerationCancelledError(EngineError):
    """The caller went away (or cancelled) before the image was finished."""

    # nginx's "client closed request": nobody reads it, but logs and metrics should not count it as ours.
    status = 499
    title = "Cancelled"


class StorageError(EngineError, OSError):
    """The adapter could not be written to or read from the disk cache (full, read-only, unwritable)."""

    title = "Storage error"


class UnservedBaseError(EngineError):
    """A request (or its LoRA) names a base model no pool of this Space serves."""

    status = 404
    title = "Base model not served"


class BackendUnavailableError(EngineError, ConnectionError):
    """The generation backend (`BACKEND_URL`, a Ray Serve cluster) could not be reached or answered nonsense."""

    status = 503
    title = "Backend unreachable"


class GpuQuotaError(EngineError):
    """The GPU lender (ZeroGPU) refused the call: the caller's or the Space's quota is used up for now."""

    status = 429
    title = "GPU quota exceeded"

    def __init__(self, message: str, retry_after_s: int = 60) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.retry_after_s))


class GpuUnavailableError(EngineError):
    """No GPU could take the call now (ZeroGPU had none, or its worker was lost; the device ran out of memory
    moving a pool in): nothing was changed, and trying again shortly may succeed."""

    status = 503
    title = "GPU unavailable"
