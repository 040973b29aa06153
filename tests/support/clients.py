"""gradio_client's `Client` as the tests make it: with time to read the app's API description on a busy machine.

gradio_client reads the app's `/info` with httpx's 5 s default; at load 8 on two cores the app took longer to
describe its endpoints, and CI's run (a `.ci/run` beside two spinning processes) errored in the fixture that makes
the shared client. No limit of its own here: pytest-timeout bounds every test, and a prediction's stream already
has none in gradio_client (the app's heartbeats keep it alive).
"""

from __future__ import annotations

from typing import Any

import httpx
from gradio_client import Client

__all__ = ["api_client"]


def api_client(url: str, **options: Any) -> Client:
    """A `Client` of the app at `url` (`options` as `Client` takes them), waiting as long as the app takes."""
    return Client(url, httpx_kwargs={"timeout": httpx.Timeout(None)}, **options)
