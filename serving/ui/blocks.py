"""The Space's Blocks: `build_demo` lays out the panels (`serving.ui.panels`) and hands them to their events.

One layout for every door that shows the UI: the Space's `app.py` and the cluster's ingress
(`serving.cluster.ingress`) both build it here, so neither imports the entry point.
"""

from __future__ import annotations

import gradio as gr

from serving.handlers import Handlers
from serving.ui import browsing, events, inputs, panels, pool_views
from serving.ui import history as session_events
from serving.ui.gradio_api import add_api_endpoints
from serving.ui.video_api import add_video_endpoint

__all__ = ["build_demo"]


def build_demo(handlers: Handlers, *, banner: str | None = None, hub_url: str = "https://huggingface.co") -> gr.Blocks:
    """The Blocks over one set of handlers; every event is a closure over them (no global state). Gradio deletes
    its files (results, uploads) once they are TEMP_FILES_MAX_AGE_S old (`Settings.delete_cache`)."""
    with gr.Blocks(title="LoRA Switchboard", delete_cache=handlers.settings.delete_cache) as demo:
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
                request = panels.request_panel(handlers, browser.base)
                with gr.Tabs():
                    with gr.Tab("Result", elem_id="result-tab"):
                        result = panels.result_panel(handlers)
                    with gr.Tab("Compare", elem_id="compare-tab"):
                        comparison = panels.compare_panel(handlers)
        status_md, refresh = panels.status_panel()
        api_md = panels.api_panel()
        browsing.wire_browsing(demo, handlers, browser, request, comparison, state, hub_url)
        events.wire_generation(handlers, request, browser.base, result, status_md, (history, state[4]))
        session_events.wire_session(demo, handlers, browser, request, result, (history, state[4]))
        events.wire_compare(handlers, request, comparison, status_md)
        events.wire_status(demo, handlers, status_md, refresh, api_md)
        source = request.source
        use = (result.use_input, result.use_into)
        inputs.wire_inputs(handlers, browser.base, state[4], request.prompt, source, result.image, use)
        add_api_endpoints(handlers)
        add_video_endpoint(handlers)
    # Gradio's queue only holds catalogue and check events (generations pass straight to the scheduler, which
    # enforces MAX_QUEUE); a size here would be a second, different limit on generations.
    demo.queue(max_size=None, default_concurrency_limit=1)
    return demo
