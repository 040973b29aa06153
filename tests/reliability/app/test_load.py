"""The launched app under faults and load: a Hub outage, out-of-memory, a client hanging up, 8 concurrent
clients of both APIs (each must get exactly the image it would get alone), a full queue, and the HF token
(used, never shown). The server is the package's (conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import threading
import time

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from PIL import Image

from engine.errors import GenerationCancelledError
from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import LOGGERS, SECRET, generate
from tests.support.clients import api_client
from tests.support.reliability_app import (
    API_DEFAULTS,
    MAX_QUEUE,
    TIMEOUT,
    App,
    api,
    assert_http_error,
    body,
    fresh_repo,
    hold_pipeline,
    plain,
    png_bytes,
    post,
    ui_handler,
)
from tests.support.waits import wait_until

# -- faults --------------------------------------------------------------------------------------------------


def test_a_hub_outage_is_a_503_and_an_app_error_then_recovers(app, serving, hub, fixtures):
    repo_id = fresh_repo(hub, fixtures)
    hub.set_fault("down")
    try:
        with pytest.raises(AppError, match=rf"could not be reached while looking up LoRA '{repo_id}'"):
            api(app, lora=repo_id)
        response = post(app, body(), lora=repo_id)
        assert_http_error(response, 503, "HubUnavailableError", "could not be reached")
    finally:
        hub.set_fault(None)
    before = app.engine.status().applied
    assert (
        png_bytes(post(app, body(seed=8), lora=repo_id))
        == generate(app.backend, plain(LoraSpec(repo_id), seed=8)).image.tobytes()
    )
    # Back to what `serving` checks after the test.
    generate(app.backend, serving[0])
    assert app.engine.status().applied == before


def test_out_of_memory_is_a_500_and_an_app_error_naming_it(app, serving, loaded, fixtures, monkeypatch):
    def out_of_memory(self, *args: object, **kwargs: object) -> None:
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 30.00 GiB")

    monkeypatch.setattr(type(loaded.pipe), "__call__", out_of_memory)
    with pytest.raises(AppError, match=r"out of memory generating 64x64; try a smaller size or fewer LoRAs"):
        api(app, lora=fixtures["second"])
    response = post(app, body(), lora=fixtures["kohya"])
    assert_http_error(response, 500, "GenerationError", "out of memory generating 64x64")


def test_a_client_that_hangs_up_mid_generation_cancels_it(app, serving, loaded, fixtures, monkeypatch):
    real_call = type(loaded.pipe).__call__
    step_reached = threading.Event()

    def slow_steps(self, *args: object, **kwargs: object):
        callback = kwargs["callback_on_step_end"]

        def slow_callback(pipe, step, timestep, tensors):
            step_reached.set()
            time.sleep(0.3)
            return callback(pipe, step, timestep, tensors)

        return real_call(self, *args, **{**kwargs, "callback_on_step_end": slow_callback})

    monkeypatch.setattr(type(loaded.pipe), "__call__", slow_steps)
    while not app.backend.outcomes.empty():
        app.backend.outcomes.get()
    # The client hangs up once a step has run (a state, not a time: a cold LoRA may take long to load first);
    # the steps' own pace (0.3 s each, 40 of them) is the generation's work, long enough to be cut short.
    url = httpx.URL(app.url)
    content = json.dumps(body(num_inference_steps=40)).encode()
    with socket.create_connection((url.host, url.port or 80), timeout=60) as client:
        client.sendall(
            f"POST {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
            f"lora: {fixtures['second']}\r\nContent-Length: {len(content)}\r\n\r\n".encode()
            + content
        )
        assert step_reached.wait(60), "the generation never reached a step"
    outcome = app.backend.outcomes.get(timeout=60)
    assert isinstance(outcome, GenerationCancelledError), outcome
    assert step_reached.is_set()


# -- load ----------------------------------------------------------------------------------------------------


def jobs(fixtures) -> list[tuple[str, dict[str, object]]]:
    """24 requests for 8 clients: 4 through gradio_client, 4 through POST /, mixed LoRAs, blends and scales."""
    peft, kohya, second, local = fixtures["peft"], fixtures["kohya"], fixtures["second"], fixtures.local["kohya"]
    loras = [
        ((), ()),
        ((peft, 0.7),),
        ((kohya, 0.5),),
        ((second, -0.5),),
        ((local, 1.0),),
        ((peft, 1.2),),
    ]
    out = []
    for client in range(8):
        for turn in range(3):
            picked = loras[(client + turn) % len(loras)]
            picked = tuple(p for p in picked if p)
            if client < 4 and turn == 1:
                picked += ((second, 0.4),) if second not in {r for r, _ in picked} else ((kohya, 0.3),)
            out.append(("gradio" if client < 4 else "http", {"loras": picked, "seed": 100 + 3 * client + turn}))
    return out


def run_job(app: App, client: Client | None, kind: str, job: dict) -> bytes:
    loras, seed = job["loras"], job["seed"]
    if kind == "gradio":
        arguments = {**API_DEFAULTS, "seed": seed}
        for index, (ref, scale) in enumerate(loras):
            prefix = "lora" if index == 0 else "lora_2"
            arguments |= {prefix: ref, f"{prefix}_scale": scale}
        path, _ = client.predict(**arguments, api_name="/generate")
        with Image.open(path) as image:
            return image.convert("RGB").tobytes()
    headers = {"lora": loras[0][0]} if loras else {}
    parameters = {"seed": seed, **({"lora_scale": loras[0][1]} if loras else {})}
    return png_bytes(
        post(app, {"inputs": API_DEFAULTS["prompt"], "parameters": body(**parameters)["parameters"]}, **headers)
    )


def test_eight_concurrent_clients_of_both_apis_get_exactly_their_own_images(app, fixtures):
    work = jobs(fixtures)
    reference = [
        generate(
            app.backend,
            GenerateRequest(
                prompt=str(API_DEFAULTS["prompt"]),
                loras=tuple(LoraSpec(ref, scale) for ref, scale in job["loras"]),
                steps=1,
                width=64,
                height=64,
                seed=job["seed"],
            ),
        ).image.tobytes()
        for _, job in work
    ]
    results: dict[int, bytes | BaseException] = {}
    start = threading.Barrier(8)

    def client_thread(index: int) -> None:
        client = api_client(app.url, verbose=False) if index < 4 else None
        start.wait(timeout=120)
        for position in range(3 * index, 3 * index + 3):
            kind, job = work[position]
            try:
                results[position] = run_job(app, client, kind, job)
            except Exception as e:
                results[position] = e

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    errors = {i: r for i, r in results.items() if isinstance(r, BaseException)}
    assert not errors, errors
    assert len(results) == len(work)
    crossed = [i for i, image in results.items() if image != reference[i]]
    assert not crossed, f"cross-talk in {[work[i] for i in crossed]}"


def test_a_full_queue_answers_busy_on_both_apis_and_the_queue_drains(app, loaded, monkeypatch):
    held = hold_pipeline(loaded, monkeypatch)
    gate, running = held.gate, held.running
    answers: queue.Queue[httpx.Response] = queue.Queue()
    holder = threading.Thread(target=lambda: answers.put(post(app, body("hold"))))
    holder.start()
    try:
        assert running.wait(timeout=60)
        waiters = [threading.Thread(target=lambda i=i: answers.put(post(app, body(seed=i)))) for i in range(MAX_QUEUE)]
        for waiter in waiters:
            waiter.start()
        wait_until(lambda: app.engine.waiting >= MAX_QUEUE, f"{MAX_QUEUE} requests waiting")
        assert app.engine.waiting == MAX_QUEUE
        assert_http_error(post(app, body()), 503, "EngineBusyError", rf"limit {MAX_QUEUE}\); try again shortly")
        with pytest.raises(AppError, match=rf"the engine is busy \({MAX_QUEUE} requests waiting"):
            api(app)
    finally:
        gate.set()
        holder.join(timeout=120)
    for waiter in waiters:
        waiter.join(timeout=120)
    statuses = sorted(answers.get(timeout=1).status_code for _ in range(MAX_QUEUE + 1))
    assert statuses == [200] * (MAX_QUEUE + 1)


# -- secrets -------------------------------------------------------------------------------------------------


def test_the_token_is_used_and_never_shown_by_the_app(app, hub, fixtures, caplog):
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    repo_id = fresh_repo(hub, fixtures)
    hub.clear_requests()
    api(app, lora=repo_id)
    assert [r for r in hub.requests if repo_id in r.path]
    assert all(r.headers.get("authorization") == f"Bearer {SECRET}" for r in hub.requests if repo_id in r.path)

    shown: list[str] = []
    for ref in (fixtures["gated"], fixtures["private"], "reliability/missing", fixtures["truncated"]):
        with pytest.raises(AppError) as raised:
            api(app, lora=ref)
        shown.append(str(raised.value))
        shown.append(post(app, body(), lora=ref).text)
    hub.set_fault("down")
    try:
        shown.append(post(app, body(), lora=fresh_repo(hub, fixtures)).text)
    finally:
        hub.set_fault(None)
    for path in ("", "config", "gradio_api/info", "gradio_api/openapi.json"):
        page = httpx.get(app.url + path, timeout=TIMEOUT)
        shown.append(page.text)
    shown.append(json.dumps(app.client.view_api(print_info=False, return_format="dict")))
    shown.append(asyncio.run(ui_handler(app, "status")()))
    shown.append(json.dumps(app.client.predict(fixtures["peft"], "", "", api_name="/lora_info")))
    shown += [caplog.text, *(r.getMessage() for r in caplog.records)]
    assert any("is private" in text for text in shown)
    assert not [text for text in shown if SECRET in text]
