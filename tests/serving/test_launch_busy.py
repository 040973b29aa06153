"""The server starts on busy cores: a first answer slower than Gradio's own 3 s reachability check (one HEAD whose
timeout ended the start with "When localhost is not accessible, a shareable link must be created", as
test_browser_low_noise.py's set-up did at load 5-8) is waited for, not taken as an unreachable localhost."""

from __future__ import annotations

import threading

import gradio as gr
import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.ui.launch import serve
from tests.support.app_server import free_port


def test_a_server_whose_first_answer_takes_longer_than_gradios_check_still_starts():
    answered = threading.Event()

    def slow_first_head(request: Request) -> Response:
        # The busy machine: the first HEAD / is answered after Gradio's 3 s timeout has passed.
        if not answered.is_set():
            answered.wait(4.0)  # stands in for a GIL held elsewhere; nothing sets it early
            answered.set()
        return Response(status_code=200)

    with gr.Blocks() as demo:
        gr.Markdown("busy")
    url = serve(
        demo,
        [Route("/", slow_first_head, methods=["HEAD"])],
        server_name="127.0.0.1",
        server_port=free_port(),
        block=False,
        quiet=True,
    )
    try:
        assert answered.is_set()
        assert httpx.get(url, timeout=30).status_code == 200
    finally:
        demo.close()
