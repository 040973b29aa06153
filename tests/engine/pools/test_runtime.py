"""The engine under concurrency, cache pressure and ZeroGPU-style per-call GPU state."""

from __future__ import annotations

import threading
import time

import pytest

from engine.errors import EngineBusyError, GenerationCancelledError, LimitExceededError
from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import assert_pristine, generate


def request(*loras: LoraSpec, seed: int = 3, steps: int = 2) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", loras=tuple(loras), steps=steps, width=64, height=64, seed=seed)


def mixed_requests(fixtures) -> list[GenerateRequest]:
    peft, kohya, second = fixtures["peft"], fixtures["kohya"], fixtures["second"]
    return [
        request(seed=1),
        request(LoraSpec(peft, scale=0.8), seed=2),
        request(LoraSpec(kohya, scale=0.5), seed=3),
        request(LoraSpec(peft, scale=0.4), LoraSpec(second, scale=0.6), seed=4),
        request(LoraSpec(second), seed=5),
        request(LoraSpec(kohya, scale=1.0), LoraSpec(peft, scale=0.3), seed=6),
    ]


def test_four_threads_get_exactly_their_single_threaded_images(make_engine, fixtures):
    engine = make_engine()
    requests = mixed_requests(fixtures)
    reference = {r.seed: generate(engine, r).image.tobytes() for r in requests}
    results: dict[tuple[int, int, int], bytes] = {}
    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for round_ in range(3):
                for r in requests[offset:] + requests[:offset]:
                    results[(offset, round_, r.seed)] = generate(engine, r).image.tobytes()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    assert len(results) == 4 * 3 * len(requests)
    for (_, _, seed), image in results.items():
        assert image == reference[seed], f"cross-talk in the image for seed {seed}"


def test_eviction_keeps_the_budget_and_never_drops_active_adapters(make_engine, fixtures, caplog):
    probe = make_engine()
    generate(probe, request(LoraSpec(fixtures["peft"])))
    size = probe.status().cached[0].host_bytes
    probe.close()

    engine = make_engine(host_cache_bytes=int(size * 2.5))
    # Three adapters of the same size: the budget holds two of them.
    peft, third, second = fixtures["peft"], fixtures["peft-noalpha"], fixtures["second"]
    for ref in (peft, second, third):
        generate(engine, request(LoraSpec(ref)))
    status = engine.status()
    names = [c.key.name for c in status.cached]
    assert status.host_bytes <= status.host_budget
    assert third in names and peft not in names, "the least recently used adapter goes first"
    assert any("evicted" in r.message for r in caplog.records) or peft not in names
    engine.close()

    tight = make_engine(host_cache_bytes=int(size * 1.2))
    both = generate(tight, request(LoraSpec(peft), LoraSpec(second)))
    assert {c.key.name for c in tight.status().cached if c.active} == {peft, second}
    assert both.adapters[0].cache == "miss"
    generate(tight, request(LoraSpec(third)))
    after = tight.status()
    assert [c.key.name for c in after.cached] == [third]
    assert after.host_bytes <= after.host_budget


def test_an_adapter_larger_than_the_whole_cache_is_refused_clearly(make_engine, fixtures):
    engine = make_engine(host_cache_bytes=1024)
    with pytest.raises(LimitExceededError, match="more than the whole host cache"):
        generate(engine, request(LoraSpec(fixtures["peft"])))


def test_per_call_mode_reapplies_every_call_and_leaves_base_weights(make_engine, fixtures, loaded, pristine):
    persistent = make_engine()
    requests = mixed_requests(fixtures)
    reference = [generate(persistent, r).image.tobytes() for r in requests]
    persistent.close()

    zero_gpu = make_engine(gpu_mode="per_call")
    for r, expected in zip(requests + requests[::-1], reference + reference[::-1], strict=True):
        result = generate(zero_gpu, r)
        assert result.image.tobytes() == expected
        assert result.swapped == bool(r.loras), "per-call mode applies the set inside every call"
        assert_pristine(loaded, pristine)


def test_a_full_queue_answers_busy_and_a_cancelled_wait_leaves(make_engine, fixtures):
    engine = make_engine(max_queue=1)
    started, release = threading.Event(), threading.Event()

    def slow_progress(step: int, total: int) -> None:
        started.set()
        release.wait(timeout=30)

    holder = threading.Thread(target=generate, args=(engine, request()), kwargs={"progress": slow_progress})
    holder.start()
    assert started.wait(timeout=30)
    cancel = threading.Event()
    waiter_errors: list[BaseException] = []

    def waiter() -> None:
        try:
            generate(engine, request(seed=9), cancel=cancel)
        except BaseException as e:
            waiter_errors.append(e)

    queued = threading.Thread(target=waiter)
    queued.start()
    # It waits in the queue before the next comes (a loop of 2 s that went on regardless would, on a loaded
    # machine, let the next one take the free place instead of being refused).
    deadline = time.monotonic() + 60
    while engine.waiting < 1:
        assert time.monotonic() < deadline, "the waiter never joined the queue"
        threading.Event().wait(0.01)
    with pytest.raises(EngineBusyError, match="busy"):
        generate(engine, request(seed=10))
    cancel.set()
    queued.join(timeout=30)
    assert isinstance(waiter_errors[0], GenerationCancelledError)
    release.set()
    holder.join(timeout=30)
    assert generate(engine, request(seed=11)).image.size == (64, 64)


def test_cancelling_mid_generation_stops_and_the_next_request_succeeds(engine):
    cancel = threading.Event()

    def cancel_after_first(step: int, total: int) -> None:
        cancel.set()

    with pytest.raises(GenerationCancelledError, match="cancelled"):
        generate(engine, request(steps=4), progress=cancel_after_first, cancel=cancel)
    assert generate(engine, request()).image.size == (64, 64)
