"""The engine's event outlet: every observer hears every event; a failing observer never fails a request."""

from __future__ import annotations

import logging

import pytest

from engine.events import EngineEvents


class Recorder:
    def __init__(self) -> None:
        self.heard: list[tuple[str, tuple[object, ...]]] = []

    def __getattr__(self, name: str):
        return lambda *args: self.heard.append((name, args))


class Broken:
    def __getattr__(self, name: str):
        def fail(*args: object) -> None:
            raise RuntimeError(f"{name} is broken")

        return fail


def test_each_event_reaches_every_observer_even_past_a_broken_one(caplog: pytest.LogCaptureFixture):
    events, recorder = EngineEvents(), Recorder()
    events.subscribe(Broken())  # type: ignore[arg-type]
    events.subscribe(recorder)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="engine.events"):
        events.request_done("http", 404)
        events.queue_waited(0.5)
        events.prepared(1.5)
        events.swapped(0.01)
        events.inferred(2.0)
        events.cache_lookup("device", True)
        events.evicted("host", 1024)
        events.hub_error("HubUnavailableError")
    assert recorder.heard == [
        ("request_done", ("http", 404)),
        ("queue_waited", (0.5,)),
        ("prepared", (1.5,)),
        ("swapped", (0.01,)),
        ("inferred", (2.0,)),
        ("cache_lookup", ("device", True)),
        ("evicted", ("host", 1024)),
        ("hub_error", ("HubUnavailableError",)),
    ]
    assert len([r for r in caplog.records if "observer of the" in r.getMessage()]) == 8
