"""ZeroGPU with COMPILE, simulated: the denoiser compiled ahead of time in a GPU call, without its weights.

The GPU call crosses a pickle boundary as into spaces' worker (the stand-in of `test_zerogpu`); AOTInductor compiles
for the CPU here (a few minutes on these cores, hence `slow`), for CUDA inside a real ZeroGPU worker (not run here:
no GPU was lent). The references are eager runs of the same weights through the same engine path.
"""

from __future__ import annotations

import pytest
import torch

from engine.pipeline.aot import AotDenoiser
from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine
from engine.pools.plan import pipeline_modules
from engine.pools.residency import Residency, module_bytes
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.hub import HubSource
from serving.backends.local import LocalBackend
from tests.reliability.test_zerogpu import PicklingGpu
from tests.support.checks import generate
from tests.support.images import assert_images_close
from tests.support.loras import PIVOTAL_PROMPT

pytestmark = pytest.mark.slow


def _request(prompt: str, *loras: tuple[str, float]) -> GenerateRequest:
    specs = tuple(LoraSpec(ref, scale=scale) for ref, scale in loras)
    return GenerateRequest(prompt, loras=specs, steps=2, seed=5, width=64, height=64)


@pytest.fixture(scope="module")
def zero(base_settings, hub):
    settings = base_settings.replace(gpu_mode="per_call", zero_gpu=True, compile="default", max_rank=64)
    loaded = load_pipeline(settings, warm=False)  # a pipeline of its own: the session's stays eager
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url), local_dir=settings.local_lora_dir, token=None, max_bytes=2**30
    )
    engine = Engine(loaded, settings, resolver)
    gpu = PicklingGpu()
    backend = LocalBackend.of(engine, zero_gpu=True, gpu=gpu)
    backend.compile_ahead("default", sizes=[(64, 64)])
    yield loaded, engine, backend, gpu
    engine.close()
    assert loaded.compiled is not None
    loaded.compiled.remove()


def test_the_package_holds_no_weights_and_serves_swaps_equal_to_eager(zero, make_engine, fixtures, pivotal):
    loaded, engine, backend, gpu = zero
    aot = loaded.compiled
    assert isinstance(aot, AotDenoiser) and aot.shapes == 1
    weights = sum(t.nbytes for t in loaded.denoiser.state_dict().values())
    assert gpu.sent and max(gpu.sent) < weights  # the call shipped no weights, and its answer (the package)...
    (package,) = aot._packages.values()
    assert not package.extra
    eager = make_engine(max_rank=64)
    requests = [
        _request("a fox"),
        _request("a fox", (fixtures["peft"], 1.0)),
        _request("a fox", (fixtures["kohya"], 0.7), (fixtures["loha"], 0.5)),
        _request("a fox", (fixtures["dora"], 1.0)),
        _request("a fox", (fixtures["high-rank"], -0.6)),
        _request(PIVOTAL_PROMPT, (pivotal["current"], 1.0)),
        _request("a fox", (fixtures["lokr"], 1.0), (fixtures["second"], 0.4)),
    ]
    calls = aot.compiled_calls
    for request in requests:
        assert_images_close(generate(backend, request), generate(eager, request), request)
    assert aot.compiled_calls == calls + 2 * len(requests) and aot.eager_calls == 0
    assert aot.binds == 1  # bound once to the module's tensors; every swap wrote into them
    status = engine.status()
    assert (status.compile_mode, status.compiled_shapes, status.recompiles) == ("default", 1, 0)


def test_a_swap_changes_the_package_output_exactly_as_eager_and_a_move_rebinds(zero, fixtures):
    loaded, _, backend, _ = zero
    aot = loaded.compiled
    calls: list = []
    seen: list = []

    def outputs() -> tuple[torch.Tensor, torch.Tensor]:
        args, kwargs = calls[0]
        with torch.inference_mode():
            return aot(*args, **kwargs)[0].clone(), aot.eager(*args, **kwargs)[0].clone()

    lora_run: list[bool] = []

    def keep(module, args, kwargs):
        if not calls:
            calls.append((args, kwargs))
        elif lora_run and not seen:
            seen.append(outputs())  # inside the LoRA's run: its set is fused now (ZeroGPU restores after each call)

    hook = loaded.denoiser.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        generate(backend, _request("a fox"))
        base_aot, base_eager = outputs()
        lora_run.append(True)
        generate(backend, _request("a fox", (fixtures["dora"], 1.0), (fixtures["kohya"], 0.5)))
    finally:
        hook.remove()
    ((lora_aot, lora_eager),) = seen
    change = lora_eager - base_eager
    assert change.abs().max() > 1e-3
    torch.testing.assert_close(lora_aot - base_aot, change, rtol=0, atol=1e-5)
    binds = aot.binds
    # The pool moved out to host RAM and back in by the pools' residency (on the CPU each move is a copy): new
    # storage, so the bound pointers are stale.
    modules = pipeline_modules(loaded)
    residency = Residency(torch.device("cpu"), module_bytes(modules))
    residency.add("aot", modules, before_leaving=lambda: None)
    residency.add("other", [torch.nn.Linear(8, 8)], before_leaving=lambda: None)
    with residency.use("other"):
        pass
    with residency.use("aot"):
        moved_aot, _ = outputs()
    assert aot.binds == binds + 1
    # Other storage picks other kernels on some CPUs (issue 28): the same outputs within rounding, as above; a
    # package still reading the old pointers would read freed memory.
    torch.testing.assert_close(moved_aot, base_aot, rtol=0, atol=1e-5)
