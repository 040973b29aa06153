"""Image-to-video and the two-stage pool through the doors (`MODELS=tiny-wan-i2v,tiny-wan22`): the body
huggingface_hub's image-to-video helper builds and gradio_client's `/generate_video` with `handle_file` give the
same MP4; on Wan 2.2 A14B's pool `guidance_scale_2` (the Gradio API's `guidance_2`) reaches the run from both
doors alike and its recipe carries it; a LoRA's low-noise scale (`parameters.loras[].scale_2`, `/generate_video`'s
`lora_scale_2`) gives the same MP4 from both doors, its recipe naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from gradio_client import handle_file
from huggingface_hub.inference._providers.hf_inference import HFInferenceBinaryInputTask

from engine.families.tiny_wan import TINY_A14B_WIDTH
from serving.demo.synthetic import save_lora
from serving.ui.video_ui import follow_scale
from serving.video import decode_mp4
from tests.support.app_server import AppServer, served_runtime
from tests.support.clients import api_client
from tests.support.video import frames
from tests.support.wan import MODULES, lora_file

I2V, A14B = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
LORA_FILE = "wan22_style.safetensors"
PROMPT, SEED, STEPS = "the fox turns its head", 4, 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:

    demo_dir = tmp_path_factory.mktemp("tiny-wan-i2v")
    # The tiny pools' local LoRA folder is the demo's: a Wan LoRA for the tiny two-stage pool's width (its
    # self-attention in diffusers' names), made here.
    generator = torch.Generator().manual_seed(22)
    made = {
        m: (
            torch.randn(4, TINY_A14B_WIDTH, generator=generator),
            torch.randn(TINY_A14B_WIDTH, 4, generator=generator) * 0.3,
        )
        for m in MODULES[:4]
    }
    save_lora(demo_dir / LORA_FILE, lora_file(made, "peft", None))
    with served_runtime({"MODELS": "tiny-wan-i2v,tiny-wan22"}, demo_dir) as (_, served):
        yield served


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
    path, info = api_client(server.url, verbose=False).predict(
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
    path, info = api_client(server.url, verbose=False).predict(
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


def test_a_loras_low_noise_scale_from_post_and_gradio_client_is_the_same_mp4(server):
    """`parameters.loras[].scale_2` and `/generate_video`'s `lora_scale_2` are the same request: the same MP4,
    whose recipe names the low-noise scale; another low-noise scale makes another video."""
    lora = {"path": f"local:{LORA_FILE}", "scale": 0.8, "scale_2": 0.3}
    parameters = {"num_inference_steps": STEPS, "seed": SEED, "num_frames": 5, "loras": [lora]}
    body = {"inputs": "a fox running", "parameters": parameters}
    answer = httpx.post(server.url, json=body, timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    path, info = api_client(server.url, verbose=False).predict(
        prompt="a fox running", lora=f"local:{LORA_FILE}", lora_scale=0.8, lora_scale_2=0.3, num_frames=5,
        steps=STEPS, seed=SEED, api_name="/generate_video",
    )  # fmt: skip
    # It ran on the two-stage pool (its low-noise guidance filled in), the LoRA at 0.8 high and 0.3 low.
    assert info["guidance_2"] is not None
    assert [(u["scale"], u["scale_2"]) for u in info["loras"]] == [(0.8, 0.3)]
    assert _video(path) == answer.content
    comment = decode_mp4(answer.content).comment or ""
    assert f"<lora:~{LORA_FILE}:0.8>" in comment and f'Lora scales 2: "~{LORA_FILE}: 0.3"' in comment
    other = {**body, "parameters": {**parameters, "loras": [{**lora, "scale_2": 1.5}]}}
    changed = httpx.post(server.url, json=other, timeout=600)
    assert changed.status_code == 200 and changed.content != answer.content


def test_the_apps_low_noise_scales_show_only_for_the_two_stage_base(server):
    """In the app itself (no browser): each LoRA's "Low-noise scale" starts hidden (the default pool, Wan 2.1
    I2V, has one stage) and the base filter's switch shows them for Wan 2.2 A14B, hides them again for I2V."""
    demo = server.demo
    lows = [c for c in demo.blocks.values() if getattr(c, "elem_id", None) in ("lora-1-scale-2", "lora-2-scale-2")]
    assert len(lows) == 2 and all(c.label == "Low-noise scale" and c.visible is False for c in lows)
    (switch,) = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "switch_lows"]
    assert [c._id for c in switch.outputs] == sorted(c._id for c in lows)
    assert [s.visible for s in switch.fn(A14B)] == [True, True]
    assert [s.visible for s in switch.fn(I2V)] == [False, False]
    # Each follows its LoRA's scale until moved; a share link (on load) and "use these settings again" set
    # whether it was moved with the values they put back (tests/serving/test_video_low_noise.py).
    follows = [fn for fn in demo.fns.values() if fn.fn is follow_scale]
    assert sorted(c._id for fn in follows for c in fn.outputs) == sorted(c._id for c in lows)
    moved = {fn.inputs[1]._id for fn in follows}
    restores = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") in ("opened", "again")]
    assert len(restores) == 2 and all(moved <= {c._id for c in fn.outputs} for fn in restores)
