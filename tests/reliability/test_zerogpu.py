"""ZeroGPU, simulated: the GPU function's arguments and result cross a pickle boundary, as into spaces' worker.

`spaces.GPU` forks a worker and pickles each call's arguments into it (spaces/zero/wrappers.py); the
fake below pickles the same way, so what a call ships is measured, not assumed. What cannot run here
(a real fork holding a GPU, CUDA itself) is said in the README.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest
import torch

from engine.caches.store import AdapterStore
from engine.caches.worker import WorkerCache
from engine.requests import GenerateRequest, LoraSpec
from serving.backends.local import LocalBackend
from serving.demo.synthetic import find_targets, make_lora
from tests.support.checks import generate


class PicklingGpu:
    """Stands in for `spaces.GPU`: arguments and result go through pickle; payload sizes are recorded."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def __call__(self, task: Callable, duration: object = None) -> Callable:
        def call(*args: object) -> object:
            payload = pickle.dumps(args)
            self.sent.append(len(payload))
            return pickle.loads(pickle.dumps(task(*pickle.loads(payload))))

        return call


def request(*refs: str) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", steps=2, seed=9, loras=tuple(LoraSpec(r) for r in refs))


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


def test_the_main_process_never_pins_or_initialises_cuda_on_zerogpu(loaded, monkeypatch):
    # ZeroGPU reports the device as cuda in the main process; the store must not pin there.
    pinned: list[int] = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(1) or self)
    store = AdapterStore(
        host_budget=2**30,
        device_budget=2**30,
        device=torch.device("cuda"),
        dtype=torch.float16,
        use_device_tier=False,
        pin=False,
    )
    targets = find_targets({"unet": loaded.pipe.unet}, {"unet": (r"attn1\.to_q$",)})
    from engine.formats.adapters import AdapterKey, LayerFactors, PreparedAdapter

    tensors = make_lora(targets, rank=2, seed=1, fmt="peft")
    downs = [t for name, t in sorted(tensors.items()) if "lora_A" in name]
    ups = [t for name, t in sorted(tensors.items()) if "lora_B" in name]
    layers = tuple(LayerFactors(i, d, u, 1.0) for i, (d, u) in enumerate(zip(downs, ups, strict=True)))
    store.add(PreparedAdapter(AdapterKey("hub", "a/b", "0" * 40, "w.safetensors"), layers, 1, 2, ("unet",)))
    assert pinned == []
    assert not torch.cuda.is_initialized()


def test_preparing_on_zerogpu_pins_nothing_even_with_the_device_reported_as_cuda(
    loaded, base_settings, hub, fixtures, monkeypatch
):
    # In ZeroGPU's main process the pipeline reports cuda; preparing an adapter must still not pin it.
    import dataclasses

    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver
    from lora_catalog.hub import HubSource

    pinned: list[int] = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(1) or self)
    settings = base_settings.replace(zero_gpu=True, gpu_mode="auto")
    source = HubSource(endpoint=hub.url, timeout_s=5)
    resolver = AdapterResolver(source, local_dir=None, token=None, max_bytes=2**30)
    engine = Engine(dataclasses.replace(loaded, device=torch.device("cuda")), settings, resolver)
    try:
        check = engine.check_lora(LoraSpec(fixtures["second"]))
    finally:
        source.close()
    assert check.layers > 0
    assert pinned == []
    assert not torch.cuda.is_initialized()
