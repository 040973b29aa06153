"""`/generate_video` through gradio_client: its signature is the request's declared fields a video reads, and it
answers the MP4 `POST /` answers for the same request, byte for byte, with the info.

The backend is a stand-in answering frames made in the test (tests/support/video.py); the tiny Wan pool's
end-to-end test is test_video_doors.py.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import httpx
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from engine.settings import Settings
from serving.handlers import Handlers
from serving.http.api import http_routes
from serving.ui.launch import serve
from serving.ui.video_api import add_video_endpoint, video_parameters
from serving.video import decode_mp4
from tests.support.app_server import free_port
from tests.support.clients import api_client
from tests.support.video import VideoBackend, frames

# The same request through both doors: prompt, LoRA (and its pair scales), frames, fps, steps, guidance, seed.
PROMPT, LORA, SEED = "a fox running", "owner/wan-style", 21


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, VideoBackend]]:
    backend = VideoBackend()
    handlers = Handlers(backend, None, Settings())  # type: ignore[arg-type]  # the endpoint needs no catalogue
    with gr.Blocks() as demo:
        add_video_endpoint(handlers)
    url = serve(demo, http_routes(handlers), server_name="127.0.0.1", server_port=free_port(), block=False, quiet=True)
    try:
        yield url.rstrip("/") + "/", backend
    finally:
        demo.close()


def test_the_signature_is_the_declared_video_fields():
    with gr.Blocks() as demo:
        add_video_endpoint(Handlers(VideoBackend(), None, Settings()))  # type: ignore[arg-type]
    (endpoint,) = [fn for fn in demo.fns.values() if fn.api_name == "generate_video"]
    assert endpoint.fn is not None
    found = [p for p in inspect.signature(endpoint.fn).parameters if p != "progress"]
    assert found == video_parameters()
    assert found[:6] == ["prompt", "negative_prompt", "lora", "lora_scale", "lora_2", "lora_2_scale"]
    assert {"num_frames", "fps", "guidance_2", "image", "seed", "steps", "guidance"} <= set(found)
    assert not {"num_images", "mask", "strength", "images", "clip_skip"} & set(found)


def test_the_video_is_the_bytes_post_answers(served):
    url, backend = served
    client = api_client(url, verbose=False)
    path, info = client.predict(
        PROMPT, "", LORA, 0.8, "", 1.0, 2, 4.0, None, None, SEED, "", None, None, 9, 8, 3.0, 0.5, None, "",
        0.25, None, None, None, api_name="/generate_video",
    )  # fmt: skip
    sent = backend.requests[-1]
    assert (sent.num_frames, sent.fps, sent.guidance_2) == (9, 8, 3.0)
    # `lora_start` is the LoRA's window (from a quarter of the steps), as `start` is over HTTP.
    assert [(s.ref, s.scale, s.scale_2, s.start, s.end) for s in sent.loras] == [(LORA, 0.8, 0.5, 0.25, None)]
    assert (info["num_frames"], info["fps"], info["duration_s"]) == (9, 8, 9 / 8)
    data = Path(path["video"] if isinstance(path, dict) else path).read_bytes()
    body = {
        "inputs": PROMPT,
        "parameters": {
            "num_inference_steps": 2,
            "guidance_scale": 4.0,
            "seed": SEED,
            "num_frames": 9,
            "fps": 8,
            "guidance_scale_2": 3.0,
            "loras": [{"path": LORA, "scale": 0.8, "scale_2": 0.5, "start": 0.25}],
        },
    }
    answer = httpx.post(url, json=body, timeout=60)
    assert answer.status_code == 200, answer.text[:300]
    # The same request, but for what each door answers: /generate_video a video, POST / what the pool makes
    # (a pool of the other kind is refused before running: test_video_kinds.py).
    assert (sent.expects, backend.requests[-1].expects) == ("video", None)
    assert dataclasses.replace(backend.requests[-1], expects="video") == sent
    assert answer.content == data
    assert len(decode_mp4(data).frames) == 9


def test_an_image_makes_it_image_to_video(served, tmp_path):
    url, backend = served
    start = tmp_path / "start.png"
    frames(1)[0].save(start)
    client = api_client(url, verbose=False)
    _, info = client.predict(
        "it turns", "", "", 1.0, "", 1.0, None, None, None, None, 3, "", None, handle_file(str(start)), 5, None,
        None, None, None, "", api_name="/generate_video",
    )  # fmt: skip
    assert backend.requests[-1].image is not None
    assert backend.requests[-1].loras == ()
    assert info["num_frames"] == 5


@pytest.mark.parametrize(("low", "lora"), [("lora_scale_2", "lora"), ("lora_2_scale_2", "lora_2")])
def test_a_low_noise_scale_for_an_empty_lora_slot_is_refused_by_name(served, low, lora):
    """A low-noise scale on a slot with no LoRA would be dropped: refused naming it, as a window there is, and
    nothing reaches the backend."""
    url, backend = served
    client = api_client(url, verbose=False)
    before = len(backend.requests)
    named = {"lora": LORA} if lora == "lora_2" else {}
    with pytest.raises(AppError, match=f"{low}=0.5 was given, but {lora} is empty: .*accepted: {lora} set to a LoRA"):
        client.predict(prompt=PROMPT, **named, **{low: 0.5}, api_name="/generate_video")
    assert len(backend.requests) == before
