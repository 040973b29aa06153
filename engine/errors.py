"""The engine's errors: the only exceptions callers need to know about.

Each message names the bad value and what is accepted, so the UI and the HTTP
endpoint can show it as it is. `app.py` maps these classes to `gr.Error` and
HTTP statuses; nothing else in the engine raises library errors unwrapped.
"""

from __future__ import annotations

__all__ = [
    "AdapterLoadError",
    "EngineBusyError",
    "EngineError",
    "GatedLoraError",
    "GenerationCancelledError",
    "GenerationError",
    "HubUnavailableError",
    "IncompatibleLoraError",
    "InvalidRequestError",
    "LimitExceededError",
    "SettingsError",
    "StorageError",
    "UnknownLoraError",
    "UnsupportedLoraVariantError",
]


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class SettingsError(EngineError, ValueError):
    """An environment variable holds a value the engine does not accept."""


class InvalidRequestError(EngineError, ValueError):
    """A request parameter is malformed (wrong type, empty, bad characters)."""


class LimitExceededError(InvalidRequestError):
    """A request or an adapter goes past a configured limit."""


class UnknownLoraError(EngineError, LookupError):
    """The named LoRA (repo, revision, file or local name) does not exist."""


class GatedLoraError(EngineError, PermissionError):
    """The LoRA's repo is gated or private: this Space does not serve it."""


class AdapterLoadError(EngineError):
    """The LoRA's file cannot be used: not safetensors, corrupt, ambiguous, bad values."""


class IncompatibleLoraError(EngineError):
    """The LoRA was made for another base model, or its tensors do not fit this one."""


class UnsupportedLoraVariantError(IncompatibleLoraError):
    """The file is a LoRA variant (LoHa, LoKr, DoRA, ...) that the fused swap cannot apply."""


class HubUnavailableError(EngineError, ConnectionError):
    """The Hugging Face Hub could not be reached in time."""


class EngineBusyError(EngineError):
    """The queue is full: try again shortly."""


class GenerationError(EngineError, RuntimeError):
    """The pipeline failed while generating (including running out of memory)."""


class GenerationCancelledError(EngineError):
    """The caller went away (or cancelled) before the image was finished."""


class StorageError(EngineError, OSError):
    """The adapter could not be written to or read from the disk cache (full, read-only, unwritable)."""
