"""The one queue across transports, on the launched app: the UI's handler, `gradio_client`'s `/generate` and
`POST /` share one scheduler, one limit and one numbering of places; a download held up at the stand-in Hub
holds up nobody else.
"""

from __future__ import annotations

import queue
import re
import threading
import time

import gradio as gr
import httpx
import pytest
from gradio_client.exceptions import AppError

from tests.support.reliability_app import (
    API_DEFAULTS,
    MAX_QUEUE,
    UI_ARGUMENTS,
    App,
    api,
    assert_http_error,
    body,
    fresh_repo,
    hold_pipeline,
    png_bytes,
    post,
    run_ui_generate,
    ui_handler,
)
from tests.support.waits import wait_until

# Per Hub request, under the 5 s read timeout the tests' Hub clients use; a cold LoRA makes two (the header by
# Range, then the file), so its preparation takes at least 8 s: long against a tiny-pipeline request.
DELAY_PER_REQUEST_S = 4.0
DOWNLOAD_DELAY_S = 2 * DELAY_PER_REQUEST_S


class Recorder:
    """Stands in for gr.Progress in a direct call of the UI's handler: keeps every description shown."""

    def __init__(self) -> None:
        self.shown: list[str] = []

    def __call__(self, *args: object, desc: str | None = None, **kwargs: object) -> None:
        if desc:
            self.shown.append(desc)


def ui_generate(app: App, progress: Recorder | None = None, **changes: object) -> object:
    """The UI's Generate handler as Gradio calls it (an async generator), from this thread."""
    handler = ui_handler(app, "generate_ui")
    return run_ui_generate(handler, **(UI_ARGUMENTS | changes), progress=progress or Recorder())


def shows(job, text: str) -> bool:
    """Whether a gradio_client job's progress has shown `text`."""
    return any(text in (p.desc or "") for p in job.status().progress_data or [])


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def test_a_slow_download_holds_up_no_other_client_of_any_transport(app, hub, fixtures):
    warm = fixtures["peft"]
    requests = {
        "ui": lambda: ui_generate(app, ref=warm, scale=0.7),
        "gradio_client": lambda: api(app, lora=warm, lora_scale=0.5),
        "post": lambda: png_bytes(post(app, body(seed=4))),
    }
    normal = {name: min(timed(work) for _ in range(2)) for name, work in requests.items()}
    cold = fresh_repo(hub, fixtures)
    hub.set_fault("slow", delay_s=DELAY_PER_REQUEST_S, paths=f"/{cold}/resolve/")
    cold_answer: queue.Queue[httpx.Response] = queue.Queue()
    try:
        started = time.perf_counter()
        threading.Thread(target=lambda: cold_answer.put(post(app, body(seed=9), lora=cold)), daemon=True).start()
        wait_until(lambda: [r for r in hub.requests if f"/{cold}/resolve/" in r.path], "the cold download to start")
        assert app.engine.waiting == 1, "the cold request waits in the queue, preparing"
        during = {name: timed(work) for name, work in requests.items()}
        behind_cold = time.perf_counter() - started
        still_held = cold_answer.empty()
        answer = cold_answer.get(timeout=120)
    finally:
        hub.set_fault(None)
    assert answer.status_code == 200, answer.text[:300]
    assert "miss" in answer.headers["X-Lora-Cache"]
    # All three were served while the download was still held at the Hub: the cold request had no answer yet (a
    # state, not a duration: each one's time beside its normal time is a loaded machine's guess, so not asserted).
    assert still_held, (during, normal, behind_cold)
    assert behind_cold < DOWNLOAD_DELAY_S, (during, behind_cold)


def test_one_limit_and_one_numbering_of_places_across_transports(app, loaded, monkeypatch):
    held = hold_pipeline(loaded, monkeypatch)
    gate, running = held.gate, held.running
    outcomes: queue.Queue[tuple[str, object]] = queue.Queue()
    holder = threading.Thread(target=lambda: outcomes.put(("holder", post(app, body("hold")))))
    holder.start()
    ui_progress = [Recorder() for _ in range(MAX_QUEUE)]
    jobs = []
    threads = []
    try:
        assert running.wait(timeout=60)
        # Places 1..MAX_QUEUE, handed out in turn to the three transports.
        for place in range(1, MAX_QUEUE + 1):
            kind = ("post", "gradio_client", "ui")[place % 3]
            if kind == "post":
                work = lambda p=place: outcomes.put((f"post{p}", post(app, body(seed=p))))  # noqa: E731
            elif kind == "ui":
                work = lambda p=place: outcomes.put((f"ui{p}", ui_generate(app, ui_progress[p - 1], seed=p)))  # noqa: E731
            else:
                work = None
                jobs.append((place, app.client.submit(**(API_DEFAULTS | {"seed": place}), api_name="/generate")))
            if work is not None:
                threads.append(threading.Thread(target=work, daemon=True))
                threads[-1].start()
            wait_until(lambda p=place: app.engine.waiting >= p, f"{place} requests waiting")
            assert app.engine.waiting == place
        # Full for everyone, whichever way they come.
        refused = post(app, body())
        assert_http_error(refused, 503, "EngineBusyError", rf"\({MAX_QUEUE} requests waiting, limit {MAX_QUEUE}\)")
        assert int(refused.headers["Retry-After"]) >= 1
        with pytest.raises(AppError, match=rf"the engine is busy \({MAX_QUEUE} requests waiting"):
            api(app)
        with pytest.raises(gr.Error, match=rf"the engine is busy \({MAX_QUEUE} requests waiting"):
            ui_generate(app)
        # gradio_client sees the scheduler's place in its job's progress.
        for place, job in jobs:
            wait_until(lambda j=job, n=place: shows(j, f"In queue: {n} of {MAX_QUEUE}"), f"job {place}'s place shown")
    finally:
        gate.set()
        holder.join(timeout=120)
    for thread in threads:
        thread.join(timeout=120)
    for _, job in jobs:
        job.result(timeout=120)
    answers = dict(outcomes.get(timeout=1) for _ in range(1 + len(threads)))
    for name, answer in answers.items():
        if name.startswith("post") or name == "holder":
            assert answer.status_code == 200, (name, answer.text[:200])
        if name.startswith("post"):
            assert answer.headers["X-Queue-Position"] == name.removeprefix("post")
    for recorder, place in ((ui_progress[p - 1], p) for p in range(1, MAX_QUEUE + 1) if p % 3 == 2):
        first = next(d for d in recorder.shown if d.startswith("In queue"))
        assert re.match(rf"In queue: {place} of \d+ ", first), recorder.shown


def test_a_queued_comparison_waits_in_the_one_queue_and_shows_its_place(app, loaded, fixtures, monkeypatch):
    held = hold_pipeline(loaded, monkeypatch)
    gate, running = held.gate, held.running
    holder = threading.Thread(target=lambda: post(app, body("hold")), daemon=True)
    holder.start()
    try:
        assert running.wait(timeout=60)
        compare = {
            "prompt": "a fox",
            "negative_prompt": "",
            "loras": fixtures["peft"],
            "scales": "0, 1",
            "include_base": False,
            "steps": 1,
            "guidance": 5.0,
            "width": 64,
            "height": 64,
            "seed": 4,
        }
        job = app.client.submit(**compare, api_name="/compare")
        # Its cells are prepared first, then it takes one place in the queue every transport shares.
        wait_until(lambda: app.engine.waiting >= 1, "the comparison waiting")
        assert app.engine.waiting == 1
        wait_until(lambda: shows(job, "In queue: 1 of"), "the comparison's place shown")
    finally:
        gate.set()
        holder.join(timeout=120)
    _, cells, info = job.result(timeout=120)
    assert [cell["caption"] for cell in cells] == info["labels"] and len(cells) == 2
    assert app.engine.waiting == 0
