"""What the plan keeps free beside the pipelines (issue 29, 4.5): the CUDA context, one pool's working memory
(one pool denoises at a time: `gpu_lock`), each pool's CUDA graph pool when graphs are recorded, and each
resident pool's float32 scratch buffers for the swap."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import torch

from engine.families import flux, sdxl
from engine.pipeline import inference
from engine.pipeline.inference import gpu_lock
from engine.pools.plan import CUDA_CONTEXT_BYTES, PlanOptions, PoolNeed, plan_memory
from engine.settings import Settings
from tests.reliability.test_budgets import plain
from tests.support.checks import generate

GIB = 2**30
A100 = 79 * GIB
SDXL = PoolNeed("sdxl", 7 * GIB, 6 * GIB, working=4 * GIB, scratch=5 * 4 * sdxl.MEMORY.largest_values)
FLUX = PoolNeed("flux", 32 * GIB, 22 * GIB, working=6 * GIB, scratch=5 * 4 * flux.MEMORY.largest_values)


def options(**changes: object) -> PlanOptions:
    return PlanOptions.of(Settings(dtype="auto", device="cpu").replace(host_ram_bytes=2**40, **changes))


def test_the_plan_keeps_the_context_and_one_pools_working_memory_free():
    plan = plan_memory([FLUX, SDXL], A100, options())
    caches = 2 * options().adapter_cache
    assert plan.room == A100 - CUDA_CONTEXT_BYTES - FLUX.working - caches


def test_with_cuda_graphs_each_pool_s_graph_pool_is_kept_too():
    plan = plan_memory([FLUX, SDXL], A100, options(compile="reduce-overhead"))
    caches = 2 * options().adapter_cache
    assert plan.room == A100 - CUDA_CONTEXT_BYTES - FLUX.working - (FLUX.working + SDXL.working) - caches


def test_a_resident_pool_holds_its_swap_s_scratch_buffers_on_the_device():
    # FLUX's largest weight (3072 x 18432) in float32, five slots: about 1.05 GiB.
    plan = plan_memory([FLUX, SDXL], A100, options())
    for need, placement in zip((FLUX, SDXL), plan.placements, strict=True):
        assert (
            placement.scratch == need.scratch
            and placement.nbytes == placement.weights + placement.pristine + need.scratch
        )
    assert sum(p.nbytes for p in plan.placements) <= plan.room


def test_every_run_on_one_gpu_shares_one_lock_and_the_cpu_has_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # `cuda` names the current device, here 0
    assert gpu_lock(torch.device("cuda")) is gpu_lock(torch.device("cuda:0"))
    assert gpu_lock(torch.device("cuda:1")) is not gpu_lock(torch.device("cuda:0"))
    with gpu_lock(torch.device("cpu")), gpu_lock(torch.device("cpu")):
        pass  # no lock: CPU runs never wait for each other


def test_an_engine_denoises_holding_its_device_s_lock(engine, monkeypatch):
    held: list[bool] = []
    lock = threading.Lock()

    @contextmanager
    def recording(device: torch.device):
        with lock:
            yield

    real = inference.infer

    def infer(*args: object, **kwargs: object):
        held.append(lock.locked())
        return real(*args, **kwargs)

    monkeypatch.setattr("engine.pools.engine.gpu_lock", recording)
    monkeypatch.setattr("engine.pools.engine.infer", infer)
    generate(engine, plain())
    assert held == [True] and not lock.locked()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_lock_is_the_current_device_s():
    assert gpu_lock(torch.device("cuda")) is gpu_lock(torch.device("cuda", torch.cuda.current_device()))
