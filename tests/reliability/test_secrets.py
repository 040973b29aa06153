"""HF_TOKEN is used (sent to the Hub as a bearer token) and never shown: not in logs at DEBUG, errors, tracebacks,
status, results or reprs. The app-level checks (the page, API answers) are in test_reliability_app.py.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Iterator

import pytest

from engine.errors import SwitchboardError
from engine.requests import LoraSpec
from tests.support.checks import LOGGERS, SECRET, generate, small
from tests.support.loras import WEIGHTS, card
from tests.support.reliability_app import fresh_repo


@pytest.fixture
def token_hub(hub, monkeypatch) -> Iterator[object]:
    """The session's stand-in Hub, accepting SECRET as its token (private repos become visible with it)."""
    # The stand-in takes its token at construction; the session's was built without one.
    monkeypatch.setattr(hub._app, "token", SECRET)
    hub.clear_requests()
    yield hub
    hub.set_fault(None)


@pytest.fixture
def debug_logs(caplog) -> pytest.LogCaptureFixture:
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def shown(error: BaseException) -> str:
    """Everything an error could show anyone: its message, repr and the whole chained traceback."""
    return "\n".join((str(error), repr(error), *traceback.format_exception(error)))


def test_the_token_is_hidden_from_settings_reprs(base_settings):
    settings = base_settings.replace(hf_token=SECRET)
    assert settings.hf_token == SECRET
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert "hf_token" not in repr(settings)


def test_the_token_is_sent_to_the_hub_and_never_shown(make_engine, fixtures, token_hub, debug_logs, loaded, capfd):
    engine = make_engine(hf_token=SECRET)
    fresh = f"secrets/lora-{uuid.uuid4().hex[:8]}"
    token_hub.add_repo(
        fresh, {"README.md": card(), WEIGHTS: (fixtures.local_dir / "local_peft.safetensors").read_bytes()}
    )
    result = generate(engine, small(LoraSpec(fresh)))
    sent = [r for r in token_hub.requests if fresh in r.path]
    assert {r.path.startswith("/api/") for r in sent} == {True, False}, "both the lookup and the download ran"
    assert all(r.headers.get("authorization") == f"Bearer {SECRET}" for r in sent)

    failures: list[BaseException] = []
    attempts = [
        LoraSpec(fixtures["gated"]),
        LoraSpec(fixtures["private"]),
        LoraSpec("secrets/does-not-exist"),
        LoraSpec(fixtures["peft"], revision="nope"),
        LoraSpec(fixtures["truncated"]),
    ]
    for spec in attempts:
        with pytest.raises(SwitchboardError) as raised:
            generate(engine, small(spec))
        failures.append(raised.value)
    # A repo never downloaded: one already in the Hub cache is served from disk while the Hub is down.
    unseen = fresh_repo(token_hub, fixtures)
    token_hub.set_fault("down")
    with pytest.raises(SwitchboardError) as raised:
        generate(make_engine(hf_token=SECRET), small(LoraSpec(unseen)))
    failures.append(raised.value)
    token_hub.set_fault(None)
    wrong = make_engine(hf_token="hf_secret_wrong_0000000000000000")
    with pytest.raises(SwitchboardError) as raised:
        generate(wrong, small(LoraSpec(fresh_repo(token_hub, fixtures))))
    failures.append(raised.value)

    assert "private" in str(failures[1]), "with the token the private repo is seen, and refused as private"
    shown_anywhere = [shown(e) for e in failures]
    shown_anywhere += [
        repr(result),
        repr(engine.status()),
        repr(engine.settings),
        str(engine.check_lora(LoraSpec(fresh))),
    ]
    shown_anywhere += [debug_logs.text, *(r.getMessage() for r in debug_logs.records)]
    out, err = capfd.readouterr()
    shown_anywhere += [out, err]
    assert any(r.levelno == logging.DEBUG for r in debug_logs.records), "DEBUG logging was on"
    leaks = [text for text in shown_anywhere if SECRET in text or "hf_secret_wrong" in text]
    assert not leaks, leaks[0][:2000]
