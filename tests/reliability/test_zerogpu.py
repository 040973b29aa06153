"""ZeroGPU, simulated: the GPU function's arguments and result cross a pickle boundary, as into spaces' worker.

`spaces.GPU` forks a worker and pickles each call's arguments into it (spaces/zero/wrappers.py); the
fake below pickles the same way, so what a call ships is measured, not assumed. What cannot run here
(a real fork holding a GPU, CUDA itself) is said in the README.
"""

from __future__ import annotations

import inspect
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr
import httpx
import pytest
import torch
from spaces.zero.gradio import error as spaces_error

from engine.caches.worker import WorkerCache
from engine.errors import GenerationCancelledError, GenerationError
from engine.requests import GenerateRequest, LoraSpec
from serving.backends.local import LocalBackend
from tests.support.app_server import serve_routes
from tests.support.checks import generate
from tests.support.waits import WAIT_S

REPO = Path(__file__).resolve().parents[2]


class PicklingGpu:
    """Stands in for `spaces.GPU` as its wrappers behave (spaces/zero/wrappers.py): arguments and results go through
    pickle (payload sizes recorded); an exception raised in the worker comes back as a `gr.Error` carrying only its
    class name; a generator function runs on a worker thread, each item pickled back, and closing the caller's
    generator sets a stop event after which the worker closes the task's generator at its next item
    (`generator_function_wrapper`, `thread_wrapper.iterate`)."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.workers: list[threading.Thread] = []
        self.stops: list[threading.Event] = []  # each generator call's: set once its caller closed it

    def __call__(self, task: Callable, duration: object = None) -> Callable:
        def call(*args: object) -> object:
            payload = pickle.dumps(args)
            self.sent.append(len(payload))
            try:
                result = task(*pickle.loads(payload))
            except Exception as e:
                raise worker_error(e) from None
            return pickle.loads(pickle.dumps(result))

        def generate(*args: object) -> Iterator[object]:
            payload = pickle.dumps(args)
            self.sent.append(len(payload))
            items: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
            stop = threading.Event()
            self.stops.append(stop)

            def iterate() -> None:
                gen = task(*pickle.loads(payload))
                while True:
                    try:
                        item = next(gen)
                    except StopIteration:
                        break
                    except Exception as e:
                        items.put(("error", worker_error(e)))
                        return
                    if stop.is_set():
                        gen.close()
                        break
                    items.put(("ok", pickle.dumps(item)))
                items.put(("end", None))

            worker = threading.Thread(target=iterate, daemon=True)
            worker.start()
            try:
                while True:
                    kind, value = items.get()
                    if kind == "end":
                        return
                    if kind == "error":
                        raise value  # type: ignore[misc]
                    try:
                        yield pickle.loads(value)  # type: ignore[arg-type]
                    except GeneratorExit:
                        stop.set()
                        raise
            finally:
                self.workers.append(worker)

        return generate if inspect.isgeneratorfunction(task) else call


def worker_error(error: Exception) -> gr.Error:
    return gr.Error(type(error).__name__, title="ZeroGPU worker error", print_exception=False)


def request(*refs: str, steps: int = 2) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", steps=steps, seed=9, loras=tuple(LoraSpec(r) for r in refs))


@pytest.fixture
def zero(make_engine):
    engine = make_engine(gpu_mode="per_call", zero_gpu=True)
    gpu = PicklingGpu()
    return engine, gpu, LocalBackend.of(engine, zero_gpu=True, gpu=gpu)


def test_a_call_ships_keys_once_the_worker_holds_the_adapter(zero, make_engine, fixtures):
    engine, gpu, runner = zero
    peft = fixtures["peft"]
    first = generate(runner, request(peft))
    again = generate(runner, request(peft))
    adapter_bytes = sum(c.host_bytes for c in engine.status().cached)
    assert gpu.sent[0] > adapter_bytes  # the first call carries the tensors
    assert gpu.sent[1] < adapter_bytes / 4  # the second only the key
    assert len(gpu.sent) == 2
    reference = generate(make_engine(), request(peft))
    assert first.image.tobytes() == again.image.tobytes() == reference.image.tobytes()


def test_a_new_worker_asks_for_the_tensors_and_the_result_is_the_same(zero, fixtures):
    engine, gpu, runner = zero
    kohya = fixtures["kohya"]
    before = generate(runner, request(kohya))
    runner.worker_cache = WorkerCache(engine.settings.device_cache_bytes)  # the worker was replaced
    after = generate(runner, request(kohya))
    assert len(gpu.sent) == 3  # first call, a call that found the worker empty, the call with tensors
    assert gpu.sent[1] < gpu.sent[2]
    assert after.image.tobytes() == before.image.tobytes()


def test_the_worker_cache_stays_in_its_budget(make_engine, fixtures):
    engine = make_engine(gpu_mode="per_call", zero_gpu=True)
    gpu = PicklingGpu()
    runner = LocalBackend.of(engine, zero_gpu=True, gpu=gpu)
    generate(runner, request(fixtures["peft"]))
    one = runner.worker_cache.nbytes
    runner.worker_cache = WorkerCache(one + one // 2)
    for ref in (fixtures["peft"], fixtures["second"], fixtures["peft-noalpha"], fixtures["peft"]):
        generate(runner, request(ref))
        assert runner.worker_cache.nbytes <= one + one // 2


# Each runs in a fresh process: `torch.cuda.is_initialized()` says whether anything in the process ever touched
# CUDA, and in a run that includes the `gpu` tests something has, before these tests begin.
_ADAPTER_STORE_CHECK = """
import torch
from engine.caches.store import AdapterStore
from engine.families.sdxl import build_tiny_pipeline
from engine.formats.adapters import AdapterKey, LayerFactors, PreparedAdapter
from serving.demo.synthetic import find_targets, make_lora

pinned = []
torch.Tensor.pin_memory = lambda self, *a, **k: pinned.append(1) or self
store = AdapterStore(
    host_budget=2**30,
    device_budget=2**30,
    device=torch.device("cuda"),
    dtype=torch.float16,
    use_device_tier=False,
    pin=False,
)
targets = find_targets({"unet": build_tiny_pipeline().unet}, {"unet": (r"attn1\\.to_q$",)})
tensors = make_lora(targets, rank=2, seed=1, fmt="peft")
downs = [t for name, t in sorted(tensors.items()) if "lora_A" in name]
ups = [t for name, t in sorted(tensors.items()) if "lora_B" in name]
layers = tuple(LayerFactors(i, d, u, 1.0) for i, (d, u) in enumerate(zip(downs, ups, strict=True)))
store.add(PreparedAdapter(AdapterKey("hub", "a/b", "0" * 40, "w.safetensors"), layers, 1, 2, ("unet",)))
assert pinned == [], pinned
assert not torch.cuda.is_initialized()
"""

_PREPARE_CHECK = """
import dataclasses, sys
import torch
from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import LoraSpec
from engine.settings import Settings
from lora_catalog.hub import HubSource

settings_json, hub_url, ref = sys.argv[1:4]
base = Settings.model_validate_json(settings_json)
loaded = load_pipeline(base, warm=False)
settings = base.replace(zero_gpu=True, gpu_mode="auto")
pinned = []
torch.Tensor.pin_memory = lambda self, *a, **k: pinned.append(1) or self
source = HubSource(endpoint=hub_url, timeout_s=5)
resolver = AdapterResolver(source, local_dir=None, token=None, max_bytes=2**30)
engine = Engine(dataclasses.replace(loaded, device=torch.device("cuda")), settings, resolver)
try:
    check = engine.check_lora(LoraSpec(ref))
finally:
    source.close()
assert check.layers > 0
assert pinned == [], pinned
assert not torch.cuda.is_initialized()
"""


def _in_a_fresh_process(code: str, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_main_process_never_pins_or_initialises_cuda_on_zerogpu(monkeypatch):
    # ZeroGPU reports the device as cuda in the main process; the store must not pin there. This process stands
    # in for one where the `gpu` tests already ran: the check must not depend on it.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    _in_a_fresh_process(_ADAPTER_STORE_CHECK)


def test_preparing_on_zerogpu_pins_nothing_even_with_the_device_reported_as_cuda(base_settings, hub, fixtures):
    # In ZeroGPU's main process the pipeline reports cuda; preparing an adapter must still not pin it.
    _in_a_fresh_process(_PREPARE_CHECK, base_settings.model_dump_json(), hub.url, fixtures["second"])


# -- cancels and errors cross the worker boundary (issue 20, defects 5 and 7) -----------------------------------


def slow_steps(loaded, monkeypatch, seen: list[int], pause: Callable[[int], None] = lambda step: None) -> None:
    """Each denoising step takes 0.1 s longer (its work), is counted in `seen` (where it ran: the worker), and
    first calls `pause(step)` (where a test holds the worker until a state)."""
    real_call = type(loaded.pipe).__call__

    def call(self, *args: object, **kwargs: object):
        callback = kwargs["callback_on_step_end"]

        def counted(pipe, step, timestep, tensors):
            seen.append(step)
            pause(step)
            time.sleep(0.1)
            return callback(pipe, step, timestep, tensors)

        return real_call(self, *args, **{**kwargs, "callback_on_step_end": counted})

    monkeypatch.setattr(type(loaded.pipe), "__call__", call)


def test_a_cancel_reaches_the_zerogpu_worker_and_stops_its_run(zero, make_engine, loaded, fixtures, monkeypatch):
    engine, gpu, runner = zero
    seen: list[int] = []
    cancel = threading.Event()

    def after_the_cancel(step: int) -> None:
        # The step after the one that cancelled waits until the caller has closed its stream: the worker's run
        # must stop at its next step then, however slowly a loaded machine got the cancel there.
        if step > 2:
            assert gpu.stops[-1].wait(WAIT_S), "the caller never closed the worker's stream"

    slow_steps(loaded, monkeypatch, seen, after_the_cancel)

    def cancel_at_step_two(step: int, total: int) -> None:
        if step >= 2:
            cancel.set()

    with pytest.raises(GenerationCancelledError):
        generate(runner, request(fixtures["peft"], steps=30), progress=cancel_at_step_two, cancel=cancel)
    for worker in gpu.workers:
        worker.join(timeout=60)
    assert len(seen) < 30  # before the fix the worker ran all 30 steps for nobody
    assert engine.status().applied == ()
    monkeypatch.undo()
    reference = generate(make_engine(), request(fixtures["peft"]))
    assert generate(runner, request(fixtures["peft"])).image.tobytes() == reference.image.tobytes()


def test_an_engine_error_in_the_worker_comes_back_as_itself(zero, loaded, monkeypatch):
    _, _, runner = zero

    def out_of_memory(self, *args: object, **kwargs: object):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(type(loaded.pipe), "__call__", out_of_memory)
    with pytest.raises(GenerationError, match=r"out of memory generating 64x64"):
        generate(runner, request())


class RefusingGpu:
    """`spaces.GPU` refusing every call with one of spaces' own errors (spaces/zero/client.py, wrappers.py)."""

    def __init__(self, title: str, message: str) -> None:
        self.error = spaces_error(title, message)

    def __call__(self, task: Callable, duration: object = None) -> Callable:
        def refuse(*args: object) -> Iterator[object]:
            raise self.error
            yield  # a generator, as the GPU call is

        return refuse


@pytest.mark.parametrize(
    ("title", "message", "status", "retry_after"),
    [
        (
            "ZeroGPU quota exceeded",
            "You have exceeded your free ZeroGPU quota (60s requested vs. 12s left). Try again in 0:04:12.",
            429,
            "252",
        ),
        ("ZeroGPU worker error", "GPU task aborted", 503, None),
        ("ZeroGPU queue timeout", "No GPU was available after 60s", 503, None),
    ],
)
def test_spaces_refusals_are_json_errors_with_a_fitting_status(make_engine, title, message, status, retry_after):
    engine = make_engine(gpu_mode="per_call", zero_gpu=True)
    backend = LocalBackend.of(engine, zero_gpu=True, gpu=RefusingGpu(title, message))
    with serve_routes(backend) as url:
        answer = httpx.post(url, json={"inputs": "a fox", "parameters": {"num_inference_steps": 1}}, timeout=60)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert message in answer.json()["error"]
    assert answer.headers.get("retry-after") == retry_after
