"""An unexpected failure answers the same fixed text on every door (issue 47, item 17): "the request failed" with a
request id, never the exception's own text (a library's message, a path); the log carries that id beside the
exception itself.

Two faults: one injected into a run (the pipeline's call raises, as in test_faults.py), which the engine catches
first, and an exception outside the tree raised by the backend (a bug), which each door catches. The doors: `POST /`,
`gradio_client` `/generate` (the Gradio door the UI shares: `serving.errors.user_errors`), and the cluster's
ingress over a stand-in replica, on its `/v1/generate` wire (read back as a `BACKEND_URL` front end reads it) and
its `POST /`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import httpx
import pytest
from gradio_client.exceptions import AppError

from engine.errors import FAILED
from engine.requests import GenerateRequest
from serving.backends.local import LocalBackend
from serving.cluster.wire import error_from_body, request_to_json
from serving.handlers import Handlers
from serving.ui.gradio_api import add_api_endpoints
from serving.ui.launch import serve
from tests.support.app_server import free_port, serve_routes
from tests.support.clients import api_client
from tests.support.serve_handles import Method, ReplicaHandle, client, front_end, replica_of, stand_in_ray

# What the fault says: a path no answer may show.
SECRET = "/srv/secret/models/unet.safetensors"
ANSWER = re.compile(re.escape(FAILED) + r" \(request id ([0-9a-f]{12})\)")
BODY = {"inputs": "a fox", "parameters": {"num_inference_steps": 1, "seed": 3}}


class Broken(LocalBackend):
    """A backend with a bug: its generate raises an exception outside the tree."""

    async def generate(self, request: GenerateRequest, **kwargs: object) -> Any:
        raise KeyError(f"no weights at {SECRET}")


@pytest.fixture(params=["run", "backend"])
def fault(request, make_engine, loaded, monkeypatch) -> tuple[Any, LocalBackend]:
    """(engine, backend) failing as `request.param` says: inside the pipeline's run, or in the backend."""
    engine = make_engine()
    if request.param == "backend":
        return engine, Broken.of(engine)

    def failing_call(self: object, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"could not read {SECRET}")

    monkeypatch.setattr(type(loaded.pipe), "__call__", failing_call)
    return engine, LocalBackend.of(engine)


@pytest.fixture
def logged(caplog) -> Callable[[str], logging.LogRecord]:
    """The ERROR record naming a request id, which must carry the exception (with its own text)."""
    caplog.set_level(logging.ERROR)

    def find(request_id: str) -> logging.LogRecord:
        found = [r for r in caplog.records if request_id in r.getMessage() and r.exc_info]
        assert len(found) == 1, [r.getMessage() for r in caplog.records]
        assert found[0].exc_info is not None and SECRET in str(found[0].exc_info[1])
        return found[0]

    return find


def request_id(text: str) -> str:
    """The answer's id; the answer is the fixed text and nothing else."""
    found = ANSWER.fullmatch(text)
    assert found, text
    assert SECRET not in text
    return found.group(1)


def test_post_answers_the_fixed_text_and_the_log_carries_its_id(fault, logged):
    _, backend = fault
    with serve_routes(backend) as url:
        answer = httpx.post(url, json=BODY, timeout=120)
    assert answer.status_code == 500, answer.text
    assert answer.json()["error_type"] in ("GenerationError", "PreparationError")
    logged(request_id(answer.json()["error"]))


@pytest.fixture
def gradio_url(fault) -> Iterator[str]:
    engine, backend = fault
    handlers = Handlers(backend, None, engine.settings)  # type: ignore[arg-type]  # no catalogue: it only generates
    with gr.Blocks() as demo:
        add_api_endpoints(handlers)
    url = serve(demo, [], server_name="127.0.0.1", server_port=free_port(), block=False, quiet=True)
    try:
        yield url
    finally:
        demo.close()


def test_gradio_client_gets_the_fixed_text_and_the_log_carries_its_id(gradio_url, logged, tmp_path: Path):
    api = api_client(gradio_url, verbose=False, download_files=str(tmp_path))
    with pytest.raises(AppError) as failed:
        api.predict(
            prompt="a fox", negative_prompt="", lora="", lora_scale=1.0, lora_2="", lora_2_scale=1.0, steps=1,
            guidance=5.0, width=64, height=64, seed=3, api_name="/generate",
        )  # fmt: skip
    logged(request_id(failed.value.message))


def test_the_cluster_ingress_answers_the_fixed_text_and_the_log_carries_its_id(fault, logged, monkeypatch):
    engine, backend = fault
    stand_in_ray(monkeypatch)
    handle = ReplicaHandle(replica_of(engine))
    if isinstance(backend, Broken):
        # The replica's own backend has the bug (Serve raises it at the ingress as itself).
        handle.generate = Method(backend.generate)
    app, _ = front_end([handle], engine.settings)
    for made in client(app):
        wired = made.post("/v1/generate", json=request_to_json(GenerateRequest(prompt="a fox", steps=1, seed=3)))
        assert wired.status_code == 500, wired.text
        # A BACKEND_URL front end raises the same class with the same text, and so answers the same id.
        on_the_front_end = error_from_body(wired.json(), wired.status_code)
        logged(request_id(str(on_the_front_end)))
        posted = made.post("/", json=BODY)
        assert posted.status_code == 500, posted.text
        logged(request_id(posted.json()["error"]))
