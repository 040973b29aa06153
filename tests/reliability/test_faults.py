"""Faults around the engine: the Hub down, slow, failing or cutting downloads short; a full or unwritable disk;
failures, out-of-memory and cancellation inside generation. Each gets a specific error, a later request after
the fault clears succeeds with the reference image, and the served set never changes on a failure.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import constants, file_download
from huggingface_hub.utils import _http

from engine.errors import (
    GenerationCancelledError,
    GenerationError,
    HubUnavailableError,
    StorageError,
)
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import LoraSpec
from lora_catalog.hub import HubSource
from tests.support.checks import generate, prime, small, unchanged
from tests.support.loras import WEIGHTS, card, peft_file
from tests.support.waits import wait_until


@pytest.fixture
def fault(hub) -> Iterator[object]:
    hub.clear_requests()
    yield hub
    hub.set_fault(None)


def fail_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's retries without their 1-8 s sleeps, and its timeouts (5 s here, 60 s on its retry) at 0.3 s.

    Only around the request that is meant to fail: a busy machine may answer a normal request slower than that.
    """
    fast_time = SimpleNamespace(sleep=lambda seconds: None, time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(_http, "time", fast_time)
    monkeypatch.setattr(file_download, "time", fast_time)
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 0.3)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.3)
    monkeypatch.setattr(file_download, "_ETAG_RETRY_TIMEOUT", 0.3)


@pytest.fixture(scope="module")
def lora_bytes(loaded) -> bytes:
    return peft_file(loaded.pipe, seed=31)


@pytest.fixture
def twins(hub, lora_bytes) -> tuple[str, str]:
    """Two fresh repos holding the same LoRA: one to make the reference image, one to break."""
    tag = uuid.uuid4().hex[:8]
    repos = (f"faults/reference-{tag}", f"faults/victim-{tag}")
    for repo_id in repos:
        hub.add_repo(repo_id, {"README.md": card(), WEIGHTS: lora_bytes})
    return repos


@pytest.fixture
def build_engine(loaded, base_settings, hub) -> Iterator[Callable[..., Engine]]:
    """Engines with a resolver of the test's own (Hub endpoint, cache folder); closed after the test."""
    made: list[Engine] = []

    def build(*, endpoint: str | None = None, cache_dir: Path | None = None, timeout_s: float = 5.0) -> Engine:
        resolver = AdapterResolver(
            HubSource(endpoint=endpoint or hub.url, timeout_s=timeout_s),
            local_dir=base_settings.local_lora_dir,
            token=None,
            max_bytes=base_settings.max_adapter_bytes,
            cache_dir=cache_dir,
        )
        made.append(Engine(loaded, base_settings, resolver))
        return made[-1]

    yield build
    for engine in made:
        engine.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def served_image(engine: Engine, repo_id: str) -> bytes:
    return generate(engine, small(LoraSpec(repo_id, scale=0.8), seed=9)).image.tobytes()


def assert_still_serving(engine: Engine, before: tuple[str, ...], good: LoraSpec, image: bytes) -> None:
    assert engine.status().applied == before
    assert generate(engine, small(good)).image.tobytes() == image


# -- the Hub ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("down", r"could not be reached while looking up LoRA 'faults/victim-\w+'"),
        ("error500", r"answered HTTP 500 while looking up LoRA 'faults/victim-\w+'"),
        ("malformed_json", r"answered malformed JSON while looking up LoRA"),
    ],
)
def test_a_failing_hub_api_is_unavailable_then_recovers(make_engine, fixtures, fault, twins, kind, fragment):
    engine, good, image = prime(make_engine, fixtures)
    reference, victim = twins
    expected = served_image(engine, reference)
    before = engine.status().applied
    fault.set_fault(kind, paths=f"/api/models/{victim}")
    with pytest.raises(HubUnavailableError, match=fragment):
        generate(engine, small(good, LoraSpec(victim)))
    assert_still_serving(engine, before, good, image)
    fault.set_fault(None)
    assert served_image(engine, victim) == expected


def test_a_hub_on_a_closed_port_is_unavailable(build_engine, fixtures, loaded, pristine):
    engine = build_engine(endpoint=f"http://127.0.0.1:{closed_port()}")
    fragment = r"the Hub at http://127\.0\.0\.1:\d+ could not be reached"
    # A LoRA never downloaded: one already in the Hub cache is served from there (tests/reliability/test_budgets.py).
    with unchanged(engine, loaded, pristine), pytest.raises(HubUnavailableError, match=fragment):
        generate(engine, small(LoraSpec("nobody/never-downloaded")))


def test_a_slow_hub_api_times_out_at_the_configured_timeout(make_engine, fixtures, fault, twins):
    engine, good, image = prime(make_engine, fixtures, hub_timeout_s=1.0)
    before = engine.status().applied
    fault.set_fault("slow", delay_s=3.0, paths=f"/api/models/{twins[1]}")
    with pytest.raises(HubUnavailableError, match=r"did not answer within 1 s while looking up LoRA"):
        generate(engine, small(good, LoraSpec(twins[1])))
    assert_still_serving(engine, before, good, image)


@pytest.mark.parametrize("kind", ["down", "truncate", "error500", "slow", "closed"])
def test_a_failed_download_is_unavailable_never_used_and_retried_later(
    make_engine, fixtures, fault, twins, monkeypatch, kind
):
    engine, good, image = prime(make_engine, fixtures)
    reference, victim = twins
    expected = served_image(engine, reference)
    before = engine.status().applied
    fail_fast(monkeypatch)
    if kind == "closed":
        template = f"http://127.0.0.1:{closed_port()}/{{repo_id}}/resolve/{{revision}}/{{filename}}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    else:
        fault.set_fault(kind, paths=f"/{victim}/resolve/", delay_s=1.0 if kind == "slow" else 0.0)
    with pytest.raises(HubUnavailableError, match=r"the Hub (could not be reached to download|failed while serving) "):
        generate(engine, small(good, LoraSpec(victim)))
    monkeypatch.undo()
    fault.set_fault(None)
    assert_still_serving(engine, before, good, image)
    assert victim not in {c.key.name for c in engine.status().cached}
    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{victim.replace('/', '--')}" / "snapshots"
    assert not list(snapshots.rglob(WEIGHTS)), "a partial download was kept as the file"
    assert served_image(engine, victim) == expected


# -- the disk --------------------------------------------------------------------------------------------


def test_an_unwritable_cache_folder_is_a_storage_error(build_engine, tmp_path, twins, loaded, pristine):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    engine = build_engine(cache_dir=blocker / "hub")
    fragment = rf"LoRA '{twins[1]}' could not be stored in the Hub cache: Not a directory"
    with unchanged(engine, loaded, pristine), pytest.raises(StorageError, match=fragment):
        generate(engine, small(LoraSpec(twins[1])))
    assert generate(build_engine(cache_dir=tmp_path / "hub"), small(LoraSpec(twins[1]))).image.size == (64, 64)


@pytest.mark.parametrize(
    ("code", "why"),
    [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "it is read-only"), (errno.EACCES, "it is not writable")],
)
def test_a_full_or_read_only_disk_is_a_storage_error(make_engine, fixtures, twins, monkeypatch, code, why):
    engine, good, image = prime(make_engine, fixtures)
    before = engine.status().applied

    def failing_write(*args: object, **kwargs: object) -> None:
        raise OSError(code, "injected")

    with monkeypatch.context() as patched:
        patched.setattr(file_download, "http_get", failing_write)
        with pytest.raises(StorageError, match=rf"LoRA '{twins[1]}' could not be stored in the Hub cache: {why}"):
            generate(engine, small(good, LoraSpec(twins[1])))
    assert_still_serving(engine, before, good, image)
    assert generate(engine, small(LoraSpec(twins[1]))).adapters[0].cache == "miss"


# -- generation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), r"out of memory generating 64x64"),
        # Unforeseen: the fixed text and an id (test_failure_ids.py), never the library's message.
        (RuntimeError("boom"), r"^the request failed \(request id [0-9a-f]{12}\)$"),
        (ValueError("bad latents"), r"^the request failed \(request id [0-9a-f]{12}\)$"),
    ],
    ids=["oom", "runtime", "value"],
)
def test_a_failure_inside_generation_rolls_back_the_swap(make_engine, fixtures, loaded, monkeypatch, error, fragment):
    engine, good, image = prime(make_engine, fixtures)
    before = engine.status().applied
    real_call = type(loaded.pipe).__call__

    def failing_call(self, *args: object, **kwargs: object):
        raise error

    monkeypatch.setattr(type(loaded.pipe), "__call__", failing_call)
    with pytest.raises(GenerationError, match=fragment):
        generate(engine, small(LoraSpec(fixtures["second"]), LoraSpec(fixtures["kohya"], scale=0.4)))
    monkeypatch.setattr(type(loaded.pipe), "__call__", real_call)
    assert_still_serving(engine, before, good, image)


def test_an_error_raised_by_the_progress_callback_rolls_back(make_engine, fixtures):
    engine, good, image = prime(make_engine, fixtures)
    before = engine.status().applied

    def client_gone(step: int, total: int) -> None:
        raise ConnectionResetError("the client went away")

    with pytest.raises(GenerationError, match=r"^the request failed \(request id [0-9a-f]{12}\)$"):
        generate(engine, small(LoraSpec(fixtures["second"])), progress=client_gone)
    assert_still_serving(engine, before, good, image)


def test_a_cancelled_generation_rolls_back_and_the_queue_moves_on(make_engine, fixtures):
    engine, good, image = prime(make_engine, fixtures)
    before = engine.status().applied
    cancel = threading.Event()
    with pytest.raises(GenerationCancelledError, match=r"cancelled"):
        generate(
            engine,
            small(LoraSpec(fixtures["second"]), steps=3),
            progress=lambda step, total: cancel.set(),
            cancel=cancel,
        )
    assert_still_serving(engine, before, good, image)

    # A client that leaves while queued behind a running request: it leaves, the queue serves the rest.
    started, release = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def hold(step: int, total: int) -> None:
        started.set()
        release.wait(timeout=60)

    def run(name: str, request, **kwargs: object) -> None:
        try:
            outcomes[name] = generate(engine, request, **kwargs).image.tobytes()
        except Exception as e:
            outcomes[name] = e

    gone = threading.Event()
    threads = [
        threading.Thread(target=run, args=("holder", small(good)), kwargs={"progress": hold}),
        threading.Thread(target=run, args=("leaver", small(LoraSpec(fixtures["second"]))), kwargs={"cancel": gone}),
        threading.Thread(target=run, args=("stayer", small(good))),
    ]
    threads[0].start()
    assert started.wait(timeout=60)
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: engine.waiting >= 2, "the leaver and the stayer waiting")
    gone.set()
    threads[1].join(timeout=60)
    release.set()
    for thread in threads:
        thread.join(timeout=60)
    assert isinstance(outcomes["leaver"], GenerationCancelledError)
    assert outcomes["holder"] == image and outcomes["stayer"] == image
    assert engine.status().applied == before
