"""Comparisons and prefetches stay in their lanes (issue 20, defects 3 and 4).

Before the fix a comparison prepared every cell in anyio's default threads before the queue saw it (a full queue
refused it only after the downloads), and gallery-click prefetches ran on the scheduler's preparation threads
and in the requests' load gate, unbounded and never cancelled, so a request waited behind them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid

import anyio
import pytest

from engine.compare import CompareRequest
from engine.errors import EngineBusyError
from engine.requests import GenerateRequest, LoraSpec
from serving.backends import submit_blocking
from serving.backends.local import LocalBackend
from serving.ui.prefetches import SessionPrefetches
from tests.support.checks import generate
from tests.support.loras import card, peft_file
from tests.support.reliability_app import hold_pipeline
from tests.support.waits import until_async, wait_until

WAIT_S = 120


def fresh_repos(hub, pipe, count: int, delay_s: float = 0.0) -> list[str]:
    repos = [f"lanes/{uuid.uuid4().hex[:10]}" for _ in range(count)]
    for seed, repo in enumerate(repos):
        hub.add_repo(repo, {"README.md": card(), "pytorch_lora_weights.safetensors": peft_file(pipe, seed=300 + seed)})
        hub.set_download_delay(repo, delay_s)
    return repos


def downloads_of(hub, repos: list[str]) -> set[str]:
    """The repos whose file the Hub was asked for (Range reads of a header not counted)."""
    return {
        repo
        for r in hub.requests
        for repo in repos
        if r.path.startswith(f"/{repo}/resolve/") and "range" not in r.headers
    }


def compare(*refs: str) -> CompareRequest:
    return CompareRequest(prompt="a fox", loras=tuple(LoraSpec(r) for r in refs), steps=1, width=64, height=64, seed=4)


# -- comparisons -------------------------------------------------------------------------------------------------


def test_a_full_queue_refuses_a_comparison_before_it_downloads_anything(make_engine, loaded, clean_hub, monkeypatch):
    engine = make_engine(max_queue=1)
    backend = LocalBackend.of(engine)
    held = hold_pipeline(loaded, monkeypatch)
    running = submit_blocking(backend.generate(GenerateRequest(prompt="hold", steps=1, seed=1)))
    try:
        assert held.running.wait(WAIT_S)
        waiting = submit_blocking(backend.generate(GenerateRequest(prompt="a fox", steps=1, seed=2)))
        wait_until(lambda: engine.waiting == 1, "one request waiting", WAIT_S)
        repos = fresh_repos(clean_hub, loaded.pipe, 2)
        with pytest.raises(EngineBusyError, match=r"limit 1"):
            submit_blocking(backend.compare(compare(*repos))).result(WAIT_S)
        assert downloads_of(clean_hub, repos) == set()
    finally:
        held.gate.set()
    running.result(WAIT_S)
    waiting.result(WAIT_S)


def test_a_comparison_is_prepared_on_the_schedulers_threads(make_engine, loaded, clean_hub, fixtures, monkeypatch):
    engine = make_engine()
    threads: list[str] = []
    real = type(engine).prepare

    def recording(self, request):
        threads.append(threading.current_thread().name)
        return real(self, request)

    monkeypatch.setattr(type(engine), "prepare", recording)
    result = submit_blocking(LocalBackend.of(engine).compare(compare(fixtures["peft"], fixtures["kohya"])))
    assert len(result.result(WAIT_S).results) == 2
    assert threads and all(name.startswith("prepare") for name in threads), threads


def test_a_cancelled_comparison_leaves_the_queue(make_engine, loaded, clean_hub, monkeypatch):
    engine = make_engine()
    backend = LocalBackend.of(engine)
    held = hold_pipeline(loaded, monkeypatch)
    running = submit_blocking(backend.generate(GenerateRequest(prompt="hold", steps=1, seed=1)))
    try:
        assert held.running.wait(WAIT_S)
        repos = fresh_repos(clean_hub, loaded.pipe, 2, delay_s=3.0)
        grid = submit_blocking(backend.compare(compare(*repos)))
        wait_until(lambda: engine.waiting == 1, "one request waiting", WAIT_S)
        grid.cancel()
        wait_until(lambda: engine.waiting == 0, "the queue empty", WAIT_S)
    finally:
        held.gate.set()
    running.result(WAIT_S)
    with pytest.raises(concurrent.futures.CancelledError):
        grid.result(WAIT_S)


def test_the_admitted_request_needs_none_of_anyios_shared_threads(make_engine):
    # Before the fix the GPU run took one of anyio's threads, which other waiters (routing, checks, Gradio's
    # sync handlers) could all be holding: the slot then sat idle until one was given back.
    backend = LocalBackend.of(make_engine())

    async def scenario() -> bool:
        gate = threading.Event()
        limit = int(anyio.to_thread.current_default_thread_limiter().total_tokens)
        holders = [asyncio.ensure_future(anyio.to_thread.run_sync(gate.wait)) for _ in range(limit)]
        limiter = anyio.to_thread.current_default_thread_limiter()
        # Every shared thread taken before the request comes.
        await until_async(lambda: limiter.borrowed_tokens >= limit, "the holders taking anyio's threads", WAIT_S)
        run = asyncio.ensure_future(backend.generate(GenerateRequest(prompt="a fox", steps=1, seed=3)))
        try:
            done, _ = await asyncio.wait({run}, timeout=60)
        finally:
            gate.set()  # every shared thread given back: a run that waited for one finishes now
            await asyncio.gather(*holders)
        served_meanwhile = run in done
        await run
        return served_meanwhile

    assert submit_blocking(scenario()).result(WAIT_S)


# -- prefetches --------------------------------------------------------------------------------------------------


def test_a_request_never_waits_behind_prefetches(make_engine, loaded, clean_hub):
    engine = make_engine(prepare_workers=2)
    backend = LocalBackend.of(engine)
    clicks = fresh_repos(clean_hub, loaded.pipe, 18, delay_s=2.0)
    prefetches = [submit_blocking(backend.prefetch(LoraSpec(repo))) for repo in clicks]
    wait_until(lambda: downloads_of(clean_hub, clicks), "the first one loading", WAIT_S)
    (cold,) = fresh_repos(clean_hub, loaded.pipe, 1)
    result = generate(backend, GenerateRequest(prompt="a fox", steps=1, seed=3, loras=(LoraSpec(cold),)))
    assert result.adapters[0].cache == "miss"
    # Before the fix the request's download waited in the gate behind 16 or more of the 18.
    assert sum(f.done() for f in prefetches) <= 2
    for future in prefetches:
        future.cancel()
    wait_until(lambda: all(f.done() for f in prefetches), "every prefetch done", WAIT_S)


def test_dropped_prefetches_never_download(make_engine, loaded, clean_hub):
    engine = make_engine()
    backend = LocalBackend.of(engine)
    clicks = fresh_repos(clean_hub, loaded.pipe, 6, delay_s=2.0)
    prefetches = [submit_blocking(backend.prefetch(LoraSpec(repo))) for repo in clicks]
    wait_until(lambda: downloads_of(clean_hub, clicks), "a download", WAIT_S)
    for future in prefetches[1:]:
        future.cancel()
    prefetches[0].result(WAIT_S)
    # The lane's thread ends once it has nothing left to take: any prefetch left would have started its download.
    wait_until(lambda: engine._prefetches._worker is None, "the prefetch worker gone", WAIT_S)
    assert downloads_of(clean_hub, clicks) == {clicks[0]}
    assert engine._prefetches.waiting == 0


def test_the_prefetch_lane_is_bounded_dropping_the_oldest(make_engine, loaded, clean_hub):
    engine = make_engine(max_queue=2)
    backend = LocalBackend.of(engine)
    clicks = fresh_repos(clean_hub, loaded.pipe, 5, delay_s=1.0)
    prefetches = [submit_blocking(backend.prefetch(LoraSpec(repo))) for repo in clicks]
    outcomes = []
    for future in prefetches:
        try:
            future.result(WAIT_S)
            outcomes.append("ready")
        except EngineBusyError as e:
            assert "dropped" in str(e)
            outcomes.append("dropped")
    # One loading at once, two waiting: the third and later clicks push the oldest waiting ones out.
    assert outcomes.count("dropped") >= 2 and outcomes[-2:] == ["ready", "ready"]


def test_a_new_pick_or_leaving_drops_the_sessions_prefetch():
    async def scenario() -> tuple[list[bool], int]:
        prefetches = SessionPrefetches()
        gate = asyncio.Event()

        async def prefetch() -> None:
            await gate.wait()

        first = asyncio.ensure_future(prefetches.run("s1", "LoRA 1", prefetch()))
        other_slot = asyncio.ensure_future(prefetches.run("s1", "LoRA 2", prefetch()))
        other_session = asyncio.ensure_future(prefetches.run("s2", "LoRA 1", prefetch()))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(prefetches.run("s1", "LoRA 1", prefetch()))  # a new pick for slot 1
        await asyncio.sleep(0)
        dropped = prefetches.leave("s2")  # the second session leaves
        gate.set()
        finished = [await t for t in (first, other_slot, other_session, second)]
        return finished, dropped

    finished, dropped = asyncio.run(scenario())
    assert finished == [False, True, False, True]
    assert dropped == 1
