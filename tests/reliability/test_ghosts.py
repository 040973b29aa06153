"""No ghosts in the queue (issue 20, defects 3 and 5): a client that leaves or cancels takes its request with it.

Each test holds the pipeline with one request, queues another through a Gradio endpoint, then leaves (closes the
event stream, as a browser or a killed `gradio_client` does) or cancels (`Job.cancel`, Gradio's `/cancel`).
Before the fix the named API's `/generate` (which yields nothing while it waits) and every comparison (a coroutine)
stayed queued after their client left: counted against `MAX_QUEUE`, downloading, then run for nobody.
`gradio_client`'s `job.cancel()` already reached the scheduler after the redesign (its test passed before too).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.support.clients import api_client
from tests.support.page_events import page_values, queued
from tests.support.reliability_app import API_DEFAULTS, TIMEOUT, App, body, hold_pipeline, launch, post
from tests.support.waits import wait_until

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


# (endpoint function, {input index: value}): a request that queues on the held pipeline.
ENDPOINTS = {
    "generate_api": {0: "a fox"},
    "compare_api": {0: "a fox", 2: "local:local_peft.safetensors"},
    "compare_ui": {0: "a fox", 2: "local:local_peft.safetensors"},
}


@pytest.mark.parametrize("name", list(ENDPOINTS))
def test_a_client_that_leaves_while_queued_leaves_the_queue(app, held, name):
    data = page_values(app.demo, name)
    for index, value in ENDPOINTS[name].items():
        data[index] = value
    with queued(app.url, app.demo, name, data, session=f"ghost-{name}", timeout=TIMEOUT) as messages:
        for _ in messages:
            if app.engine.waiting >= 1:
                break
    # The stream is closed: the client went away while its request waited.
    wait_until(lambda: app.engine.waiting == 0, f"{name}: its request to leave the queue with its client", WAIT_S)


def test_a_gradio_client_cancel_while_queued_leaves_the_queue(app, held):
    client = api_client(app.url, verbose=False)
    job = client.submit(**API_DEFAULTS, api_name="/generate")
    wait_until(lambda: app.engine.waiting == 1, "the job waiting", WAIT_S)
    job.cancel()
    wait_until(lambda: app.engine.waiting == 0, "the cancelled job to leave the queue", WAIT_S)
