"""`import app` is light, and `python app.py` with nothing configured starts the offline demo and answers HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serving.demo.example import demo_examples
from tests.support.app_server import free_port, wait_http

REPO = Path(__file__).resolve().parents[2]
IMPORT_CHECK = """
import json, socket, sys

def refuse(*args, **kwargs):
    raise OSError("the network was used while importing app")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
import app

heavy = ("torch", "diffusers", "transformers", "engine.pipeline.loading", "engine.pools.engine", "serving.runtime")
print(json.dumps(sorted(name for name in heavy if name in sys.modules)))
"""


def test_importing_app_loads_no_model_and_uses_no_network():
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK], cwd=REPO, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_python_app_py_without_configuration_serves_the_offline_demo(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_ID", "BASE_MODEL_ID", "CUDA_VISIBLE_DEVICES")}
    env |= {
        "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        # Keep this test off a GPU the machine may have: it is about the no-GPU start.
        "CUDA_VISIBLE_DEVICES": "",
    }
    log = tmp_path / "app.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_http(url, timeout=240)
        page = httpx.get(url, timeout=30)
        config = httpx.get(f"{url}config", timeout=30)
        image = httpx.post(
            url,
            content='{"inputs": "ember style, a fox", "parameters": {"num_inference_steps": 2, "seed": 1}}',
            headers={"lora": "local:ember_glaze.safetensors"},
            timeout=180,
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    output = log.read_text()
    assert page.status_code == 200, output[-3000:]
    assert "Offline demo" in page.text
    # Its examples, each with its LoRA (issue 51): a schedule, an edit from two references and a video, shown while
    # their pools still load.
    ids = {component["props"].get("elem_id") for component in config.json()["components"]}
    assert {example.elem_id for example in demo_examples()} <= ids, output[-3000:]
    assert image.status_code == 200, output[-3000:]
    assert image.headers["content-type"] == "image/jpeg"
    assert "serving the offline demo (no CUDA GPU was found)" in output
    assert f"Running on local URL:  http://127.0.0.1:{port}" in output


def test_an_explicit_model_id_that_cannot_load_stops_with_a_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env |= {"MODEL_ID": str(tmp_path / "no-such-model"), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    done = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 1
    assert f"LoRA Switchboard cannot start: MODEL_ID='{tmp_path / 'no-such-model'}' could not be loaded" in done.stderr


def test_a_quantize_value_not_offered_stops_start_up_naming_the_accepted_ones(monkeypatch):
    """Issue 31, "Bad input": refused by the entry point before anything loads (the settings' own refusals are
    tests/engine/test_settings.py's)."""
    import app

    accepted = "is not accepted; accepted: off, fp8, int4, auto"
    monkeypatch.setenv("QUANTIZE", "int8")
    with pytest.raises(SystemExit, match=rf"^LoRA Switchboard cannot start: QUANTIZE='int8' {accepted}"):
        app.main()
    monkeypatch.setenv("QUANTIZE", "auto")
    monkeypatch.setenv("MODELS", "tiny-flux:int8")
    with pytest.raises(SystemExit, match=rf"MODELS item 'tiny-flux:int8': QUANTIZE 'int8' {accepted}"):
        app.main()
