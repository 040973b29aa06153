"""Regression tests for the small defects of issue 10, each of which failed before its fix."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
import torch
from safetensors.torch import load, save

from engine.errors import AdapterLoadError, GenerationCancelledError
from engine.requests import GenerateRequest, LoraSpec
from tests.support.app_server import recording_backend, serve_app, serve_routes
from tests.support.checks import backend_of, generate
from tests.support.loras import peft_file
from tests.support.page_events import page_values, queued

TIMEOUT = httpx.Timeout(120.0)
BODY = '{"inputs": "a fox", "parameters": {"num_inference_steps": 2, "seed": 5}}'


def plain(**fields: object) -> GenerateRequest:
    return GenerateRequest(**{"prompt": "a fox in a forest", "steps": 2, "seed": 7, **fields})  # type: ignore[arg-type]


# -- Engine.status() while a swap adds pristine copies --------------------------------------------------------


def test_status_while_swaps_add_pristine_copies_never_fails(make_engine, fixtures):
    # Each new engine starts with no pristine copies, so its first swap adds one per touched weight while
    # another thread reads the status; a tiny GIL switch interval makes the interleaving all but certain.
    errors: list[BaseException] = []
    stop = threading.Event()
    engines: list[object] = []

    def read_status() -> None:
        while not stop.is_set():
            for engine in list(engines):
                try:
                    engine.status()
                except RuntimeError as e:  # "dictionary changed size during iteration"
                    errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=read_status, daemon=True)
    reader.start()
    try:
        for _ in range(6):
            engine = make_engine()
            engines[:] = [engine]
            generate(engine, plain(steps=1, loras=(LoraSpec(fixtures["kohya"]), LoraSpec(fixtures["peft"]))))
    finally:
        stop.set()
        reader.join(30)
        sys.setswitchinterval(interval)
    assert errors == []
    assert engines[0].status().pristine_bytes > 0


# -- an unexpected library error while preparing is a JSON error on POST / ------------------------------------


def test_an_unexpected_library_error_while_preparing_is_a_json_500(engine, fixtures, monkeypatch):
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("the library broke")

    monkeypatch.setattr("engine.formats.adapters.load_file", broken)
    with serve_routes(backend_of(engine)) as url:
        response = httpx.post(url, content=BODY, headers={"lora": fixtures["peft"]}, timeout=TIMEOUT)
        monkeypatch.undo()
        after = httpx.post(url, content=BODY, headers={"lora": fixtures["peft"]}, timeout=TIMEOUT)
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error_type"] == "PreparationError"
    # The fixed text and an id (test_failure_ids.py); the library's message stays in the log.
    assert re.fullmatch(r"the request failed \(request id [0-9a-f]{12}\)", response.json()["error"])
    assert after.status_code == 200


# -- float8 LoRA files ---------------------------------------------------------------------------------------


@pytest.fixture
def local_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "loras"
    folder.mkdir()
    return folder


def _float8_lora(loaded, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A LoRA whose tensors are `dtype`, and the same values exactly in float32."""
    tensors = load(peft_file(loaded.pipe, seed=31))
    low = {name: t.to(dtype) for name, t in tensors.items()}
    return low, {name: t.to(torch.float32) for name, t in low.items()}


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_lora_loads_and_matches_its_exact_float32_copy(make_engine, loaded, local_dir, dtype):
    low, exact = _float8_lora(loaded, dtype)
    (local_dir / "f8.safetensors").write_bytes(save(low))
    (local_dir / "f32.safetensors").write_bytes(save(exact))
    engine = make_engine(local_lora_dir=local_dir)
    from_f8 = generate(engine, plain(loras=(LoraSpec("local:f8.safetensors"),)))
    from_f32 = generate(engine, plain(loras=(LoraSpec("local:f32.safetensors"),)))
    base = generate(engine, plain())
    assert from_f8.image.tobytes() == from_f32.image.tobytes()
    assert from_f8.image.tobytes() != base.image.tobytes()


def test_a_float8_lora_with_infinities_is_refused_by_name(make_engine, loaded, local_dir):
    low, _ = _float8_lora(loaded, torch.float8_e5m2)
    name = sorted(low)[0]
    broken = low[name].to(torch.float32)
    broken.view(-1)[0] = float("inf")
    low[name] = broken.to(torch.float8_e5m2)
    (local_dir / "inf8.safetensors").write_bytes(save(low))
    engine = make_engine(local_lora_dir=local_dir)
    with pytest.raises(AdapterLoadError, match="NaN or infinite"):
        engine.check_lora(LoraSpec("local:inf8.safetensors"))


# -- a local file name outside latin-1 over POST / ----------------------------------------------------------------


def test_a_local_lora_named_outside_latin1_is_served_over_http(make_engine, loaded, local_dir):
    name = "狐の森.safetensors"
    (local_dir / name).write_bytes(peft_file(loaded.pipe, seed=32))
    engine = make_engine(local_lora_dir=local_dir)
    with serve_routes(backend_of(engine)) as url:
        # curl and httpx send a header's bytes as given: UTF-8.
        response = httpx.post(url, content=BODY, headers={"lora": f"local:{name}".encode()}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:300]
    ref, _, cache = response.headers["x-lora-cache"].rpartition("=")
    assert unquote(ref) == f"local:{name}"
    assert cache == "miss"


# -- cancelling stops before the VAE decode -----------------------------------------------------------------------


def test_a_cancelled_generation_does_not_decode_and_the_next_one_does(engine, loaded, monkeypatch):
    vae = loaded.pipe.vae
    decodes: list[int] = []
    original = vae.decode

    def counting(*args: object, **kwargs: object) -> object:
        decodes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(vae, "decode", counting)
    cancel = threading.Event()

    def cancel_at_first_step(step: int, total: int) -> None:
        cancel.set()

    with pytest.raises(GenerationCancelledError):
        generate(engine, plain(steps=3), progress=cancel_at_first_step, cancel=cancel)
    assert decodes == []
    generate(engine, plain(steps=1))
    assert decodes == [1]


# -- the browser going away cancels a UI generation -------------------------------------------------------------


def test_a_browser_that_goes_away_cancels_its_ui_generation(engine, fixtures):
    from lora_catalog.catalog import Catalog
    from serving.ui.history import FORM

    recording = recording_backend(engine)
    catalog = Catalog(None, local_dirs=(fixtures.local_dir,), refresh=False)
    first_step = threading.Event()

    class HoldingBackend(type(recording)):  # type: ignore[misc]
        def _call_gpu(self, pool, prepared, progress, preview, cancel):
            # Where every transport's request runs once the scheduler admits it.
            def hold(step: int, total: int) -> None:
                # The first step waits for the cancel the disconnect should cause (at most 30 s).
                if step == 1:
                    first_step.set()
                    (cancel or threading.Event()).wait(30)
                if progress is not None:
                    progress(step, total)

            return super()._call_gpu(pool, prepared, hold, preview, cancel)

    holding = HoldingBackend(engine)
    try:
        with serve_app(engine, catalog, backend=holding) as app:
            data = page_values(app.demo, "generate_ui")
            # The form, then the video controls (frames, fps: unread on an image pool), as the handler takes them.
            values = dict(zip(FORM, data[: len(FORM)], strict=True))
            values |= {"prompt": "a fox", "steps": 40, "randomize": False}
            data = [values[name] for name in FORM] + data[len(FORM) :]
            sent = queued(app.url, app.demo, "generate_ui", data, session="disconnect-test", timeout=TIMEOUT)
            with sent as messages:
                # Read like a browser (the handler's ticks keep messages coming) until the generation holds at
                # its first step, then hang up.
                seen = []
                for message in messages:
                    seen.append(str(message)[:200])
                    if first_step.is_set() or message.get("msg") == "process_completed":
                        break
                assert first_step.is_set(), f"the generation never reached its first step; the stream said {seen}"
            # The stream is closed: the browser went away.
            outcome = holding.outcomes.get(timeout=60)
    finally:
        catalog.close()
    assert isinstance(outcome, GenerationCancelledError)
