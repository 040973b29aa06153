"""Image-to-video and the two-stage pool through the doors (`MODELS=tiny-wan-i2v,tiny-wan22`): the body
huggingface_hub's image-to-video helper builds and gradio_client's `/generate_video` with `handle_file` give the
same MP4; on Wan 2.2 A14B's pool `guidance_scale_2` (the Gradio API's `guidance_2`) reaches the run from both
doors alike and its recipe carries it. (A LoRA item's `scale_2` is read alike by both doors:
test_client_video.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file
from huggingface_hub.inference._providers.hf_inference import HFInferenceBinaryInputTask

from serving.video import decode_mp4
from tests.support.app_server import AppServer, serve_app
from tests.support.video import frames

I2V, A14B = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
PROMPT, SEED, STEPS = "the fox turns its head", 4, 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    from engine.settings import Settings
    from serving.runtime import build_runtime

    demo_dir = tmp_path_factory.mktemp("tiny-wan-i2v")
    settings = Settings.from_env({"MODELS": "tiny-wan-i2v,tiny-wan22"})
    runtime = build_runtime(settings, demo_dir=demo_dir, cuda=lambda: False)
    try:
        assert runtime.wait_ready(timeout=600)
        engine = runtime.backend.served.default.engine  # type: ignore[attr-defined]
        with serve_app(engine, runtime.catalog, backend=runtime.backend, allowed_paths=[demo_dir]) as served:
            yield served
    finally:
        runtime.close()


def _video(path: object) -> bytes:
    return Path(path["video"] if isinstance(path, dict) else path).read_bytes()  # type: ignore[index, arg-type]


def test_image_to_video_from_huggingface_hubs_body_and_gradio_client_is_the_same_mp4(server, tmp_path):
    start = tmp_path / "start.png"
    frames(1, 64, 64)[0].save(start)
    parameters = {"prompt": PROMPT, "num_frames": 5, "num_inference_steps": STEPS, "seed": SEED}
    prepared = HFInferenceBinaryInputTask("image-to-video").prepare_request(
        inputs=start.read_bytes(), parameters=parameters, headers={}, model=f"{server.url}models/{I2V}", api_key=None
    )
    answer = httpx.post(prepared.url, content=prepared.data, headers=prepared.headers, timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.headers["content-type"] == "video/mp4"
    path, info = Client(server.url, verbose=False).predict(
        prompt=PROMPT, image=handle_file(str(start)), num_frames=5, steps=STEPS, seed=SEED, base=I2V,
        api_name="/generate_video",
    )  # fmt: skip
    assert _video(path) == answer.content
    assert info["mode"] == "image-to-video" and info["num_frames"] == 5
    assert len(decode_mp4(answer.content).frames) == 5


def test_the_low_noise_guidance_and_scale_reach_the_two_stage_pool_from_both_doors(server):
    body = {
        "inputs": "a fox running",
        "parameters": {"num_inference_steps": STEPS, "seed": SEED, "num_frames": 5, "guidance_scale_2": 2.0},
    }
    answer = httpx.post(f"{server.url}models/{A14B}", json=body, timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    path, info = Client(server.url, verbose=False).predict(
        prompt="a fox running", num_frames=5, steps=STEPS, seed=SEED, guidance_2=2.0, base=A14B,
        api_name="/generate_video",
    )  # fmt: skip
    assert _video(path) == answer.content
    assert info["guidance_2"] == 2.0
    comment = decode_mp4(answer.content).comment or ""
    assert "CFG scale 2: 2" in comment
    # The low-noise guidance is used: another value makes another video.
    changed = {**body, "parameters": {**body["parameters"], "guidance_scale_2": 6.0}}
    other = httpx.post(f"{server.url}models/{A14B}", json=changed, timeout=600)
    assert other.status_code == 200 and other.content != answer.content
