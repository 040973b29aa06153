"""No ghosts in the queue (issue 20, defects 3 and 5): a client that leaves or cancels takes its request with it.

Each test holds the pipeline with one request, queues another through a Gradio endpoint, then leaves (closes the
event stream, as a browser or a killed `gradio_client` does) or cancels (`Job.cancel`, Gradio's `/cancel`).
Before the fix the named API's `/generate` (which yields nothing while it waits) and every comparison (a coroutine)
stayed queued after their client left: counted against `MAX_QUEUE`, downloading, then run for nobody.
`gradio_client`'s `job.cancel()` already reached the scheduler after the redesign (its test passed before too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.clients import api_client
from tests.support.reliability_app import API_DEFAULTS, TIMEOUT, App, body, hold_pipeline, launch, post

WAIT_S = 60


@pytest.fixture(scope="module")
def app(loaded, base_settings, hub, fixtures) -> Iterator[App]:
    with launch(loaded, base_settings, hub, fixtures) as started:
        yield started


@pytest.fixture
def held(app, loaded, monkeypatch) -> Iterator[None]:
    """The pipeline busy with one request (prompt "hold") for the test's length."""
    pipeline = hold_pipeline(loaded, monkeypatch)
    holder = threading.Thread(target=lambda: post(app, body("hold")))
    holder.start()
    assert pipeline.running.wait(WAIT_S)
    try:
        yield
    finally:
        pipeline.gate.set()
        holder.join(WAIT_S)


def wait_until(probe, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# (endpoint function, {input index: value}): a request that queues on the held pipeline.
ENDPOINTS = {
    "generate_api": {0: "a fox"},
    "compare_api": {0: "a fox", 2: "local:local_peft.safetensors"},
    "compare_ui": {0: "a fox", 2: "local:local_peft.safetensors"},
}


@pytest.mark.parametrize("name", list(ENDPOINTS))
def test_a_client_that_leaves_while_queued_leaves_the_queue(app, held, name):
    fn_index, fn = next((i, f) for i, f in app.demo.fns.items() if f.name == name)
    data = [getattr(c, "value", None) for c in fn.inputs]
    for index, value in ENDPOINTS[name].items():
        data[index] = value
    session = f"ghost-{name}"
    join = httpx.post(
        f"{app.url}gradio_api/queue/join",
        json={"data": data, "fn_index": fn_index, "session_hash": session, "trigger_id": fn.targets[0][0]},
        timeout=TIMEOUT,
    )
    assert join.status_code == 200, join.text
    with httpx.stream(
        "GET", f"{app.url}gradio_api/queue/data", params={"session_hash": session}, timeout=TIMEOUT
    ) as stream:
        for _ in stream.iter_lines():
            if app.engine.waiting >= 1:
                break
    # The stream is closed: the client went away while its request waited.
    assert wait_until(lambda: app.engine.waiting == 0), f"{name}: the request stayed queued after its client left"


def test_a_gradio_client_cancel_while_queued_leaves_the_queue(app, held):
    client = api_client(app.url, verbose=False)
    job = client.submit(**API_DEFAULTS, api_name="/generate")
    assert wait_until(lambda: app.engine.waiting == 1)
    job.cancel()
    assert wait_until(lambda: app.engine.waiting == 0)
