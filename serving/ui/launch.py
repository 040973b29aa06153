"""One server for the UI, its named API and the routes beside them (`POST /`, `GET /metrics`): launched by Gradio
(`serve`, the Space), or as an ASGI app another server hosts (`asgi_app`, the cluster's front end on Ray Serve).

Either way the limits of `POST /` hold on Gradio's doors too: an upload (the UI's editor, `gradio_client`'s
`handle_file`) is at most MAX_BODY_BYTES (Gradio's `max_file_size`), and PIL's own bomb limit, which Gradio's
upload handling meets before `engine.images.decode_image` judges the file, comes from MAX_INPUT_PIXELS."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gradio as gr
import httpx
from fastapi import FastAPI

from engine.images import cap_decoding
from serving.http.api import MAX_BODY_BYTES
from serving.http.body import MAX_INPUT_PIXELS
from serving.ui import formatting as fmt

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

__all__ = ["asgi_app", "serve"]

_SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif")
_MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


def _looks() -> dict[str, Any]:
    # System fonts: a Space's visitors should not wait on a font CDN, and offline there is none.
    theme = gr.themes.Soft(primary_hue="violet", secondary_hue="amber", font=_SYSTEM_FONTS, font_mono=_MONO_FONTS)
    return {"footer_links": ["api", "gradio"], "theme": theme, "css": fmt.APP_CSS, "show_error": True}


def serve(
    demo: gr.Blocks,
    routes: Sequence[BaseRoute],
    *,
    server_name: str | None = None,
    server_port: int | None = None,
    allowed_paths: Sequence[str] = (),
    block: bool = True,
    quiet: bool = False,
    max_file_size: int = MAX_BODY_BYTES,
    max_pixels: int = MAX_INPUT_PIXELS,
) -> str:
    """Serve the UI, its API and `routes` (the inference-API POST) from one server; returns its local URL.
    `max_file_size` and `max_pixels`: the settings' MAX_BODY_BYTES and MAX_INPUT_PIXELS."""
    cap_decoding(max_pixels)
    # FastAPI(routes=...) puts ours before Gradio's, so `POST /` is ours while `GET /` stays the UI.
    # `_frontend=False` skips Gradio's own reachability check: one HEAD with a 3 s timeout, whose timeout ends it
    # at once with "When localhost is not accessible, a shareable link must be created" — on busy cores (pools
    # loading in the background hold the GIL) a start that would have served. `_answers` waits longer instead.
    _, local_url, _ = demo.launch(
        max_file_size=max_file_size,
        server_name=server_name,
        server_port=server_port,
        app_kwargs={"routes": list(routes)},
        allowed_paths=list(allowed_paths),
        prevent_thread_lock=not block,
        quiet=quiet,
        _frontend=False,
        **_looks(),
    )
    _answers(local_url)
    return local_url


def _answers(url: str, timeout_s: float = 120.0) -> None:
    """Wait until the server just started answers `url` (any status below 500); a RuntimeError naming the URL
    after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.head(url, timeout=10.0).status_code < 500:
                return
        except httpx.TransportError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server started at {url} does not answer after {timeout_s:.0f} s") from e
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server started at {url} answers only with errors after {timeout_s:.0f} s")
        time.sleep(0.2)  # a poll's interval, not a wait for a state


def asgi_app(
    demo: gr.Blocks,
    routes: Sequence[BaseRoute],
    *,
    allowed_paths: Sequence[str] = (),
    max_file_size: int = MAX_BODY_BYTES,
    max_pixels: int = MAX_INPUT_PIXELS,
) -> FastAPI:
    """The same UI, API and `routes` as `serve`, with its limits, as an ASGI app for another server to host (its
    lifespan starts Gradio's queue)."""
    cap_decoding(max_pixels)
    # Ours first, as `serve` puts them: `POST /` is ours while `GET /` stays the UI.
    app = FastAPI(routes=list(routes))
    paths = list(allowed_paths)
    return gr.mount_gradio_app(app, demo, "/", allowed_paths=paths, max_file_size=max_file_size, **_looks())
