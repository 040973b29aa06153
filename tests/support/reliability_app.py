"""Helpers shared by several test modules."""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import gradio as gr
import httpx
import pytest
from gradio_client import Client
from PIL import Image

from engine.requests import GenerateRequest, LoraSpec
from tests.support.app_server import recording_backend, serve_app
from tests.support.checks import SECRET, generate
from tests.support.clients import api_client
from tests.support.loras import WEIGHTS, card

TIMEOUT = httpx.Timeout(120.0)

# One limit for every transport (the scheduler): 8 concurrent clients need 1 running + 7 waiting.
MAX_QUEUE = 8

API_DEFAULTS: dict[str, object] = {
    "prompt": "a harbour at dawn",
    "negative_prompt": "",
    "lora": "",
    "lora_scale": 1.0,
    "lora_2": "",
    "lora_2_scale": 1.0,
    "steps": 1,
    "guidance": 5.0,
    "width": 64,
    "height": 64,
    "seed": 17,
}

# `/generate`'s arguments for the client tests that compare its images with other endpoints' (2 steps, seed 21).
CLIENT_GENERATE: dict[str, object] = {
    "prompt": "a fox in a forest",
    "negative_prompt": "",
    "lora": "",
    "lora_scale": 1.0,
    "lora_2": "",
    "lora_2_scale": 1.0,
    "steps": 2,
    "guidance": 5.0,
    "width": 64,
    "height": 64,
    "seed": 21,
}

HTTP_STATUS = {
    "AdapterLoadError": 400,
    "PickleOnlyError": 400,
    "AmbiguousWeightsError": 400,
    "IncompatibleLoraError": 400,
    "UnsupportedLoraVariantError": 400,
    "LimitExceededError": 400,
    "InvalidRequestError": 400,
    "LoraNotFoundError": 404,
    "GatedLoraError": 403,
}

# The UI Generate handler's arguments for a one-step 64x64 image with no LoRA (tests change what they need).
UI_ARGUMENTS: dict[str, object] = {
    "prompt": "a harbour at dawn",
    "negative": "",
    "ref": "",
    "revision": "",
    "weight": "",
    "scale": 1.0,
    "ref_2": "",
    "revision_2": "",
    "weight_2": "",
    "scale_2": 1.0,
    "size": "64x64",
    "steps": 1,
    "guidance": 5.0,
    "sampler": "",  # "": the LoRA's recommendation or the model's own
    "clip_skip": 1,  # A1111's count: none skipped
    "num_images": 1,
    "recommended": True,
    "seed": 1,
    "randomize": False,
    "source": None,  # no input image: text-to-image
    "strength": None,  # the pool's default
    "browsed": "",  # the base filter ("": the default pool)
    "kept": [],  # the session's history
    # The video controls' values (frames, fps): read only where the browsed pool makes videos.
    "num_frames": 17,
    "fps": 16,
    # Each LoRA's low-noise scale: read only where the browsed pool has two stages.
    "low": 1.0,
    "low_2": 1.0,
    # The page's request (the share link is built from its headers).
    "page": SimpleNamespace(headers={"host": "localhost:7860"}),
}


@dataclass(frozen=True)
class App:
    url: str
    engine: object
    backend: object
    client: Client
    demo: gr.Blocks


@contextmanager
def launch(loaded, base_settings, hub, fixtures) -> Iterator[App]:
    """The app as a Space runs it (an engine with an HF token), on a free port, until the block ends."""
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver
    from lora_catalog.catalog import Catalog
    from lora_catalog.hub import HubSource

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hub._app, "token", SECRET)
        settings = base_settings.replace(hf_token=SECRET, max_queue=MAX_QUEUE)
        catalog = Catalog(HubSource(endpoint=hub.url, token=SECRET, timeout_s=5), local_dirs=(fixtures.local_dir,))
        resolver = AdapterResolver(catalog, local_dir=fixtures.local_dir, token=SECRET, max_bytes=2**30)
        engine = Engine(loaded, settings, resolver)
        backend = recording_backend(engine)
        try:
            with serve_app(engine, catalog, hub_url=hub.url, backend=backend) as served:
                yield App(served.url, engine, backend, api_client(served.url, verbose=False), served.demo)
        finally:
            hub.set_fault(None)
            engine.close()
            catalog.close()


def serve_peft(app: App, fixtures) -> Iterator[tuple[GenerateRequest, bytes]]:
    """The app serving fixtures['peft'] at 0.7; yields that request and its image, and checks both after the test."""
    request = GenerateRequest(
        prompt="a harbour at dawn", loras=(LoraSpec(fixtures["peft"], 0.7),), steps=1, width=64, height=64, seed=5
    )
    image = generate(app.backend, request).image.tobytes()
    before = app.engine.status().applied
    yield request, image
    assert app.engine.status().applied == before, "a failed request changed the served set"
    assert generate(app.backend, request).image.tobytes() == image


def api(app: App, **overrides: object) -> tuple[bytes, dict]:
    path, info = app.client.predict(**(API_DEFAULTS | overrides), api_name="/generate")
    with Image.open(path) as image:
        return image.convert("RGB").tobytes(), info


def post(app: App, body: str | bytes | dict, **headers: str) -> httpx.Response:
    content = json.dumps(body) if isinstance(body, dict) else body
    return httpx.post(app.url, content=content, headers={"accept": "image/png", **headers}, timeout=TIMEOUT)


def png_bytes(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text[:500]
    with Image.open(io.BytesIO(response.content)) as image:
        return image.convert("RGB").tobytes()


def body(prompt: str = "a harbour at dawn", **parameters: object) -> dict:
    return {"inputs": prompt, "parameters": {"num_inference_steps": 1, "width": 64, "height": 64, **parameters}}


def assert_http_error(response: httpx.Response, status: int, error_type: str | tuple[str, ...], pattern: str) -> None:
    """A JSON error with this status and class whose message matches `pattern` (a regex)."""
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith("application/json")
    answer = response.json()
    assert answer["error_type"] in ((error_type,) if isinstance(error_type, str) else error_type)
    assert re.search(pattern, answer["error"]), answer["error"]


def fresh_repo(hub, fixtures) -> str:
    repo_id = f"reliability/app-{uuid.uuid4().hex[:8]}"
    hub.add_repo(repo_id, {"README.md": card(), WEIGHTS: (fixtures.local_dir / "local_peft.safetensors").read_bytes()})
    return repo_id


def plain(*loras: LoraSpec, seed: int) -> GenerateRequest:
    return GenerateRequest(prompt="a harbour at dawn", loras=loras, steps=1, width=64, height=64, seed=seed)


def ui_handler(app: App, name: str) -> Callable[..., object]:
    return next(f.fn for f in app.demo.fns.values() if getattr(f.fn, "__name__", "") == name)


def run_ui_generate(handler: Callable[..., object], **arguments: object) -> object:
    """Drive the UI's Generate handler as Gradio does (an async generator: it yields while it waits, then the
    result) from this thread; returns the last output."""

    async def drain() -> object:
        last: object = None
        async for output in handler(**arguments):  # type: ignore[attr-defined]
            last = output
        return last

    return asyncio.run(drain())


@dataclass(frozen=True)
class HeldPipeline:
    """Requests prompted "hold" stop in the pipeline until `gate` is set; `running` says one got there."""

    gate: threading.Event
    running: threading.Event


def hold_pipeline(loaded, monkeypatch: pytest.MonkeyPatch) -> HeldPipeline:
    """Make the pipeline hold every request whose prompt is "hold" (undone with the test's monkeypatch)."""
    real_call = type(loaded.pipe).__call__
    held = HeldPipeline(threading.Event(), threading.Event())

    def call(self, *args: object, **kwargs: object):
        if kwargs.get("prompt") == "hold":
            held.running.set()
            held.gate.wait(timeout=120)
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(type(loaded.pipe), "__call__", call)
    return held
