"""Pools that take turns on the device are compiled without CUDA graphs (issue 29 §4.8): each move puts a pool's
weights at new addresses, and torch records every shape's graph again at the next call while keeping the earlier
ones (a `StaticInputIdxMismatch` is not counted toward its re-record limit), so graphs would grow with every move.
Pools that stay resident keep them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.pipeline import compiled as compiled_module
from engine.pipeline.compiled import CompiledDenoiser
from engine.pools.plan import MemoryPlan, Placement
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import DEFAULT_MODEL_ID as SDXL_ID
from engine.settings import PoolSetting
from families.sd15 import MODEL_ID as SD15_MODEL_ID


@pytest.fixture
def compiles(monkeypatch) -> list[dict[str, object]]:
    """What torch.compile is asked for (nothing is compiled)."""
    asked: list[dict[str, object]] = []
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn, **kw: asked.append(kw) or fn)
    return asked


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_a_denoiser_compiled_without_cuda_graphs_keeps_the_rest_of_its_mode(compiles, mode):
    with_graphs = CompiledDenoiser(nn.Linear(2, 2), mode)
    without = CompiledDenoiser(nn.Linear(2, 2), mode, cudagraphs=False)
    assert with_graphs.cudagraphs and not without.cudagraphs
    assert compiles[0]["mode"] == mode
    expected = {**torch._inductor.list_mode_options(mode), "triton.cudagraphs": False}
    assert compiles[1]["options"] == expected and compiles[1].get("mode") is None


def test_default_mode_is_compiled_as_it_was(compiles):
    assert not CompiledDenoiser(nn.Linear(2, 2), "default", cudagraphs=False).cudagraphs
    assert compiles[0]["mode"] == "default"


@pytest.mark.parametrize(("resident", "cudagraphs"), [(True, True), (False, False)])
def test_pools_taking_turns_are_warmed_up_without_cuda_graphs(
    base_settings, loaded, loaded_sd15, monkeypatch, resident, cudagraphs
):
    asked: list[object] = []
    monkeypatch.setattr("engine.pools.startup.warm_up", lambda lp, s, **kw: asked.append(kw["cudagraphs"]) or lp)

    def plan(needs, total, options):
        # The plan's verdict is what this test sets: every pool resident, or the pools taking turns.
        return MemoryPlan(total, total, tuple(Placement(n.name, n.weights, 0) for n in needs), resident=resident)

    monkeypatch.setattr("engine.pools.pools.plan_memory", plan)
    settings = base_settings.replace(
        compile="reduce-overhead",
        pools=(PoolSetting(loaded.model_id, SDXL_ID), PoolSetting(loaded_sd15.model_id, SD15_MODEL_ID)),
    )
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**20)

    def load(pool_settings, warm: bool = True, **_: object):
        return loaded if pool_settings.base_model_id == SDXL_ID else loaded_sd15

    pools = build_pools(settings, resolver, load, warm=True, memory=lambda _: 2**40)
    pools.close()
    assert asked == [cudagraphs, cudagraphs]


def _recorded_graphs(device: torch.device) -> int:
    """CUDA graphs in this thread's graph tree (torch's own bookkeeping, read-only here)."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(device.index or 0, create_if_none_exists=False)
    if manager is None or manager.roots is None:
        return 0
    nodes, count = [node for roots in manager.roots.values() for node in roots], 0
    while nodes:
        node = nodes.pop()
        count += 1
        nodes.extend(child for children in node.children.values() for child in children)
    return count


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_twenty_moves_of_a_pool_compiled_for_taking_turns_record_no_graph():
    from engine.pools.flat import FlatWeights

    torch._dynamo.reset()
    device = torch.device("cuda", torch.cuda.current_device())
    module = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)).to(device)
    compiled = CompiledDenoiser.install(module, "reduce-overhead", cudagraphs=False)
    x = torch.randn(4, 64, device=device)
    with torch.inference_mode():
        with compiled.learning():
            for _ in range(3):
                module(x)
        weights = FlatWeights([module], pin=True)
        before = _recorded_graphs(device)  # other tests' graphs, in a run with them
        for _ in range(20):
            weights.to_host()
            weights.to_device(device)
            for _ in range(3):
                module(x)
    compiled.remove()
    # With CUDA graphs, each move that changed the addresses would add a recording (whether the allocator hands
    # back the same addresses is its choice, so that count is not asserted).
    assert compiled.compiled_calls == 60 and _recorded_graphs(device) == before
