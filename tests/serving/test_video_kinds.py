"""Each named endpoint answers one kind, and a pool of the other is refused where requests are checked, before
anything runs (`GenerateRequest.expects`, `engine.video_checks.kind_refusal`): gradio_client's `/generate` and
`/generate_images` on the tiny Wan pool (which rendered a whole video and answered its first frame), and
`/generate_video` on the tiny SDXL pool (which ran, then refused). Neither pool's denoiser is called. `POST /`
answers what the pool makes (test_video_mixed.py)."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from families.sdxl import MODEL_ID as SDXL
from families.wan import MODEL_ID as WAN
from serving.handlers import Handlers
from serving.http.api import http_routes
from serving.ui.gradio_api import add_api_endpoints
from serving.ui.launch import serve
from serving.ui.video_api import add_video_endpoint
from tests.support.app_server import free_port
from tests.support.checks import backend_of
from tests.support.clients import api_client
from tests.support.dit import hub_pools

PROMPT = "a fox running through snow"


@pytest.fixture(scope="module")
def served(loaded, loaded_wan, base_settings, hub, fixtures) -> Iterator[tuple[Client, dict[str, list[int]]]]:
    """The named API over an image pool and a video pool, and each denoiser's calls (counted by a hook)."""
    calls: dict[str, list[int]] = {SDXL: [], WAN: []}
    hooks = [
        loaded.pipe.unet.register_forward_hook(lambda *_: calls[SDXL].append(1)),
        loaded_wan.pipe.transformer.register_forward_hook(lambda *_: calls[WAN].append(1)),
    ]
    pipelines = [(loaded, SDXL), (loaded_wan, WAN)]
    try:
        with hub_pools(pipelines, base_settings, hub.url, fixtures.local_dir) as pools:
            handlers = Handlers(backend_of(pools), None, base_settings)  # type: ignore[arg-type]  # no catalogue
            with gr.Blocks() as demo:
                add_api_endpoints(handlers)
                add_video_endpoint(handlers)
            url = serve(demo, http_routes(handlers), server_name="127.0.0.1", server_port=free_port(), block=False)
            try:
                yield api_client(url, verbose=False), calls
            finally:
                demo.close()
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("endpoint", ["/generate", "/generate_images"])
def test_an_image_endpoint_refuses_a_video_pool_before_running(served, endpoint):
    client, calls = served
    arguments = {"prompt": PROMPT, "steps": 2, "base": WAN, "api_name": endpoint}
    with pytest.raises(AppError, match=r"this endpoint answers images, but this pool's model \(Wan-AI/Wan2\.1-T2V"):
        client.predict(**arguments)
    assert calls[WAN] == []


def test_the_video_endpoint_refuses_an_image_pool_before_running(served):
    client, calls = served
    with pytest.raises(AppError, match=r"answers videos, but this pool's model \(stabilityai/stable-diffusion-xl"):
        client.predict(prompt=PROMPT, steps=2, base=SDXL, api_name="/generate_video")
    assert calls[SDXL] == []
    # Each on its own kind runs.
    _, info = client.predict(prompt=PROMPT, steps=2, num_frames=5, base=WAN, api_name="/generate_video")
    assert info["num_frames"] == 5 and calls[WAN]
