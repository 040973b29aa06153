"""One server for the UI, its named API and the routes beside them (`POST /`, `GET /metrics`): launched by Gradio
(`serve`, the Space), or as an ASGI app another server hosts (`asgi_app`, the cluster's front end on Ray Serve)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gradio as gr
from fastapi import FastAPI

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
) -> str:
    """Serve the UI, its API and `routes` (the inference-API POST) from one server; returns its local URL."""
    # FastAPI(routes=...) puts ours before Gradio's, so `POST /` is ours while `GET /` stays the UI.
    _, local_url, _ = demo.launch(
        server_name=server_name,
        server_port=server_port,
        app_kwargs={"routes": list(routes)},
        allowed_paths=list(allowed_paths),
        prevent_thread_lock=not block,
        quiet=quiet,
        **_looks(),
    )
    return local_url


def asgi_app(demo: gr.Blocks, routes: Sequence[BaseRoute], *, allowed_paths: Sequence[str] = ()) -> FastAPI:
    """The same UI, API and `routes` as `serve`, as an ASGI app for another server to host (its lifespan starts
    Gradio's queue)."""
    # Ours first, as `serve` puts them: `POST /` is ours while `GET /` stays the UI.
    return gr.mount_gradio_app(FastAPI(routes=list(routes)), demo, "/", allowed_paths=list(allowed_paths), **_looks())
