"""COMPILE on a CUDA device (skipped where there is none): CUDA graphs captured once stay valid across swaps.

`reduce-overhead` records a CUDA graph per compiled shape at start-up; the swap writes into the same weight
tensors, whose pointers the graphs hold, so no swap re-captures. Captures are counted where every one begins,
`torch.cuda.CUDAGraph.capture_begin`. A pool moved out to host RAM and back has its weights at new addresses:
torch records each shape's graph again, once, and the images stay equal to eager. Not run on the machines this
was written on (no GPU was lent).
"""

from __future__ import annotations

import pytest
import torch

from engine.pipeline.compiled import dynamo_compiles
from engine.pipeline.loading import load_pipeline, warm_up
from engine.pools.engine import Engine
from engine.pools.plan import pipeline_modules
from engine.pools.residency import Residency, module_bytes
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.hub import HubSource
from tests.support.checks import generate
from tests.support.images import assert_images_close
from tests.support.loras import PIVOTAL_PROMPT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SWAPS = 20


def _engine(loaded, settings, hub) -> Engine:
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url), local_dir=settings.local_lora_dir, token=None, max_bytes=2**30
    )
    return Engine(loaded, settings, resolver)


def _requests(fixtures, pivotal) -> list[GenerateRequest]:
    sets = [
        ("a fox", ((fixtures["peft"], 1.0),)),
        ("a fox", ((fixtures["kohya"], 0.8),)),
        ("a fox", ((fixtures["loha"], 1.0), (fixtures["peft"], 0.5))),
        ("a fox", ((fixtures["dora"], 1.0),)),
        ("a fox", ((fixtures["lokr"], -0.7),)),
        ("a fox", ((fixtures["high-rank"], 1.0),)),
        (PIVOTAL_PROMPT, ((pivotal["current"], 1.0),)),
        ("a fox", ()),
    ]
    out = []
    for index in range(SWAPS):
        prompt, loras = sets[index % len(sets)]
        scale = 1 - 0.2 * (index // len(sets))
        specs = tuple(LoraSpec(ref, scale=round(s * scale, 3)) for ref, s in loras)
        out.append(GenerateRequest(prompt, loras=specs, steps=3, seed=2, width=64, height=64))
    return out


@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_twenty_swaps_capture_nothing_again_and_equal_eager(base_settings, hub, fixtures, pivotal, monkeypatch, mode):
    settings = base_settings.replace(device="cuda", dtype="float16", compile=mode, max_rank=64)
    loaded = warm_up(load_pipeline(settings, warm=False), settings, sizes=[(64, 64)])
    eager_settings = settings.replace(compile="off")
    eager_loaded = load_pipeline(eager_settings, warm=False)
    compiled_engine, eager_engine = _engine(loaded, settings, hub), _engine(eager_loaded, eager_settings, hub)
    captures: list[int] = []
    begin = torch.cuda.CUDAGraph.capture_begin

    def counted(graph, *args, **kwargs):
        captures.append(1)
        return begin(graph, *args, **kwargs)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", counted)
    try:
        compiles = dynamo_compiles()
        for request in _requests(fixtures, pivotal):
            assert_images_close(generate(compiled_engine, request), generate(eager_engine, request), request)
        assert captures == []  # graphs recorded at start-up only (none at all without CUDA graphs)
        assert dynamo_compiles() == compiles
        assert loaded.compiled is not None
        assert loaded.compiled.recompiles == 0 and loaded.compiled.eager_calls == 0
    finally:
        compiled_engine.close()
        eager_engine.close()
        if loaded.compiled is not None:
            loaded.compiled.remove()


def test_a_pool_brought_back_records_its_graphs_once_and_stays_equal_to_eager(
    base_settings, hub, fixtures, pivotal, monkeypatch
):
    settings = base_settings.replace(device="cuda", dtype="float16", compile="reduce-overhead", max_rank=64)
    loaded = warm_up(load_pipeline(settings, warm=False), settings, sizes=[(64, 64)])
    eager_settings = settings.replace(compile="off")
    eager_loaded = load_pipeline(eager_settings, warm=False)
    compiled_engine, eager_engine = _engine(loaded, settings, hub), _engine(eager_loaded, eager_settings, hub)
    modules = pipeline_modules(loaded)
    other = [torch.nn.Linear(256, 256, device="cuda")]  # another pool: the budget holds either, never both
    residency = Residency(torch.device("cuda"), module_bytes(modules))
    residency.add("compiled", modules, before_leaving=compiled_engine.prepare_to_leave_device)
    residency.add("other", other, before_leaving=lambda: None)
    captures: list[int] = []
    begin = torch.cuda.CUDAGraph.capture_begin

    def counted(graph, *args, **kwargs):
        captures.append(1)
        return begin(graph, *args, **kwargs)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", counted)
    try:
        requests = _requests(fixtures, pivotal)[:8]
        for moves in range(2):
            with residency.use("other"):
                pass
            captured = len(captures)
            with residency.use("compiled"):
                for request in requests:
                    assert_images_close(
                        generate(compiled_engine, request), generate(eager_engine, request), (moves, request)
                    )
            # At most one recording for the one shape (none when the allocator gave back the same addresses).
            assert len(captures) - captured <= 1
        assert loaded.compiled is not None and loaded.compiled.recompiles == 0
    finally:
        compiled_engine.close()
        eager_engine.close()
        if loaded.compiled is not None:
            loaded.compiled.remove()
