"""A Gradio event sent through the launched app's queue as the page sends it, without a browser.

The page posts the event's inputs to `gradio_api/queue/join` (its function's index, the button that triggered it, a
session) and reads the session's server-sent stream on `gradio_api/queue/data` until `process_completed`. Tests
that need the UI's own handler (its parsing, its queue turn, a client that hangs up mid-run) send it this way; the
named API's endpoints go through `gradio_client` instead (`tests.support.clients`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

__all__ = ["completed", "event", "page_values", "queued"]

TIMEOUT = httpx.Timeout(300.0)


def event(demo: Any, name: str) -> tuple[int, Any]:
    """The app's event whose handler is the function `name`: its index (the page's `fn_index`) and its block."""
    return next((index, fn) for index, fn in demo.fns.items() if fn.name == name)


def page_values(demo: Any, name: str) -> list[Any]:
    """The inputs of event `name` as a fresh page holds them (each component's value), in the handler's order."""
    return [getattr(component, "value", None) for component in event(demo, name)[1].inputs]


@contextmanager
def queued(
    url: str, demo: Any, name: str, data: list[Any], *, session: str | None = None, timeout: httpx.Timeout = TIMEOUT
) -> Iterator[Iterator[dict[str, Any]]]:
    """Event `name` of the app at `url` sent with `data` as the page sends it; the block reads the session's stream,
    one message per line (`{}` for a line that carries none). Leaving the block closes the stream: the page gone."""
    fn_index, fn = event(demo, name)
    session = session or f"page-{name}-{uuid.uuid4().hex}"
    join = httpx.post(
        f"{url}gradio_api/queue/join",
        json={"data": data, "fn_index": fn_index, "session_hash": session, "trigger_id": fn.targets[0][0]},
        timeout=timeout,
    )
    assert join.status_code == 200, join.text
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}, timeout=timeout) as sent:
        yield (json.loads(line.removeprefix("data:")) if line.startswith("data:") else {} for line in sent.iter_lines())


def completed(url: str, demo: Any, name: str, data: list[Any], **options: Any) -> dict[str, Any]:
    """The queue's last message for event `name` sent with `data` (`success`, and `output`: the handler's outputs'
    `data`, or its `error`), read as the page reads it."""
    with queued(url, demo, name, data, **options) as messages:
        for message in messages:
            if message.get("msg") == "process_completed":
                return message
    raise AssertionError(f"the queue's stream ended before {name} completed")
