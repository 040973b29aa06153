"""LoRA Switchboard: the Gradio UI, its named API, and one server that also answers inference-API POSTs.

Thin on purpose: `build_demo` lays out the panels (`serving.ui.panels`) and hands them to the events
(`serving.ui.events`), which call the shared handlers (`serving.handlers`) over one backend and format what
comes back (`serving.ui.formatting`). The named API is `serving.ui.gradio_api`, the HTTP endpoint
`serving.http.api`. Nothing is loaded at import; `main()` builds the runtime (`serving.runtime.build_runtime`)
and serves it (`serving.ui.launch.serve`).
"""

from __future__ import annotations

import logging
import os

import gradio as gr

# On ZeroGPU `spaces` must come before anything that initialises CUDA; elsewhere it is cheap and inert.
import spaces  # noqa: F401

from serving.handlers import Handlers
from serving.ui import browsing, events, inputs, panels, pool_views
from serving.ui import history as session_events
from serving.ui.gradio_api import add_api_endpoints

__all__ = ["build_demo", "main"]

logger = logging.getLogger(__name__)


def build_demo(handlers: Handlers, *, banner: str | None = None, hub_url: str = "https://huggingface.co") -> gr.Blocks:
    """The Blocks over one set of handlers; every event is a closure over them (no global state)."""
    with gr.Blocks(title="LoRA Switchboard") as demo:
        panels.header(banner)
        # Entries shown, page, triggers inserted per slot, each slot's LoRA recommendations, form values waiting for
        # the base filter's change (a share link's); the session's history.
        state = (gr.State([]), gr.State(0), gr.State({}), gr.State({}), gr.State(None))
        history = gr.State([])
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                served = handlers.default.base_model_id
                browser = panels.browser_panel(
                    served,
                    pool_views.base_choices(handlers.pools),
                    pool_views.base_note(handlers.pools, served),
                    civitai=handlers.civitai,
                )
            with gr.Column(scale=4, elem_id="request-column"):
                request = panels.request_panel(handlers)
                with gr.Tabs():
                    with gr.Tab("Result", elem_id="result-tab"):
                        result = panels.result_panel(handlers)
                    with gr.Tab("Compare", elem_id="compare-tab"):
                        comparison = panels.compare_panel(handlers)
        status_md, refresh = panels.status_panel()
        api_md = panels.api_panel()
        browsing.wire_browsing(demo, handlers, browser, request, comparison, state, hub_url)
        events.wire_generation(handlers, request, browser.base, result, status_md, history)
        session_events.wire_session(demo, handlers, browser, request, result, (history, state[4]))
        events.wire_compare(handlers, request, comparison, status_md)
        events.wire_status(demo, handlers, status_md, refresh, api_md)
        source = request.source
        inputs.wire_inputs(handlers, browser.base, state[4], request.prompt, source, result.image, result.use_input)
        add_api_endpoints(handlers)
    # Gradio's queue only holds catalogue and check events (generations pass straight to the scheduler, which
    # enforces MAX_QUEUE); a size here would be a second, different limit on generations.
    demo.queue(max_size=None, default_concurrency_limit=1)
    return demo


def main() -> None:
    from engine.errors import SettingsError
    from engine.settings import Settings
    from serving.http.api import http_routes
    from serving.runtime import build_runtime
    from serving.ui.launch import serve

    try:
        settings = Settings.from_env(os.environ)
        logging.basicConfig(level=settings.log_level_number, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        runtime = build_runtime(settings)
    except SettingsError as e:
        raise SystemExit(f"LoRA Switchboard cannot start: {e}") from e
    handlers = Handlers(runtime.backend, runtime.catalog, runtime.settings, boot_s=runtime.boot_s)
    demo = build_demo(handlers, banner=runtime.banner, hub_url=runtime.hub_url)
    serve(
        demo,
        http_routes(handlers, metrics=settings.metrics),
        server_name=settings.server_name,
        server_port=settings.server_port,
        allowed_paths=[str(d) for d in runtime.local_dirs],
        max_file_size=settings.max_body_bytes,
        max_pixels=settings.max_input_pixels,
    )


if __name__ == "__main__":
    main()
