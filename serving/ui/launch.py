"""One server for the UI, its named API and the routes beside them (`POST /`, `GET /metrics`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import gradio as gr

from serving.ui import formatting as fmt

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

__all__ = ["serve"]

_SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif")
_MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


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
        show_error=True,
        quiet=quiet,
        footer_links=["api", "gradio"],
        # System fonts: a Space's visitors should not wait on a font CDN, and offline there is none.
        theme=gr.themes.Soft(primary_hue="violet", secondary_hue="amber", font=_SYSTEM_FONTS, font_mono=_MONO_FONTS),
        css=fmt.APP_CSS,
    )
    return local_url
