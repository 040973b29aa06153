"""Where an error becomes an answer: one function per transport, reading what the error itself carries.

Every class of the one tree (`lora_catalog.errors.SwitchboardError`) knows its HTTP status and title, so
nothing here keys on class names; anything else that reaches a transport is a bug and answers 500 with the fixed
text of `engine.errors.EngineError.unforeseen` ("the request failed" and an id the log carries beside the exception),
never the exception's own text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import gradio as gr
from starlette.responses import JSONResponse

from engine.errors import EngineBusyError, GenerationError, GpuQuotaError
from lora_catalog.errors import SwitchboardError

__all__ = ["json_error", "user_errors"]

logger = logging.getLogger(__name__)


@contextmanager
def user_errors() -> Iterator[None]:
    """Errors of the tree become a `gr.Error` with their message and title (`gradio_client` raises AppError); any
    other exception (a bug, a library's) the fixed text and id of `EngineError.unforeseen` (Gradio would show its own
    text: the app launches with `show_error`). A `gr.Error` raised inside passes as it is."""
    try:
        yield
    except SwitchboardError as e:
        raise gr.Error(str(e), title=e.title, print_exception=False) from e
    except gr.Error:
        raise
    except Exception as e:
        failed = GenerationError.unforeseen(e, logger, "a Gradio call")
        raise gr.Error(str(failed), title=failed.title, print_exception=False) from e


def json_error(error: SwitchboardError) -> JSONResponse:
    """The inference API's error shape: `{"error": message, "error_type": class name}` with the error's status.

    A full queue and a used-up GPU quota also say when to come back (`Retry-After`, in seconds: the
    scheduler's estimate, or the GPU lender's).
    """
    retry = error.retry_after_s if isinstance(error, EngineBusyError | GpuQuotaError) else None
    headers = {"Retry-After": str(retry)} if retry is not None else None
    return JSONResponse(
        {"error": str(error), "error_type": type(error).__name__}, status_code=error.status, headers=headers
    )
