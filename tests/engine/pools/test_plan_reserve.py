"""What the plan keeps free beside the pipelines (issue 29, 4.5): the CUDA context, one pool's working memory
(one pool denoises at a time, or one step at a time: `engine.pipeline.stepshare`), with step sharing each pool's
paused run's state (issue 48), each pool's CUDA graph pool when graphs are recorded, and each resident pool's
float32 scratch buffers for the swap."""

from __future__ import annotations

import pytest
import torch

from engine.errors import SettingsError
from engine.families import flux, sdxl
from engine.pipeline import inference
from engine.pipeline.sharing import device_scheduler, scheduler_for, sharing_mode
from engine.pipeline.stepshare import DeviceScheduler
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


def test_every_run_on_one_gpu_shares_one_scheduler_and_the_cpu_shares_none_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # `cuda` names the current device, here 0
    assert device_scheduler(torch.device("cuda")) is device_scheduler(torch.device("cuda:0"))
    assert device_scheduler(torch.device("cuda:1")) is not device_scheduler(torch.device("cuda:0"))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert sharing_mode("auto", cpu, per_call=False) == "off"
    assert sharing_mode("auto", cuda, per_call=False) == "step"
    # ZeroGPU: each call has its own GPU; the runs keep the whole-run lock, no step sharing.
    assert sharing_mode("auto", cuda, per_call=True) == "run"
    assert sharing_mode("step", cpu, per_call=False) == "step"


@pytest.mark.parametrize("sharing", ["run", "step"])
def test_an_engine_denoises_holding_its_device_s_turn(make_engine, sharing):
    held: list[bool] = []
    scheduler = DeviceScheduler()
    real = inference.infer

    def infer(*args: object, **kwargs: object):
        held.append(scheduler.busy)
        return real(*args, **kwargs)

    engine = make_engine(device_sharing=sharing)
    with scheduler_for(torch.device("cpu"), scheduler), pytest.MonkeyPatch.context() as patch:
        patch.setattr("engine.pools.engine.infer", infer)
        generate(engine, plain())
    assert held == [True] and not scheduler.busy


def test_with_step_sharing_each_pool_s_paused_state_is_kept_too():
    wan = PoolNeed("wan", 3 * GIB, 3 * GIB, working=5 * GIB, paused=GIB // 4)
    sdxl = PoolNeed("sdxl", 7 * GIB, 6 * GIB, working=4 * GIB, paused=GIB // 8)
    caches = 2 * options().adapter_cache
    shared = plan_memory([wan, sdxl], A100, options(device_sharing="step"))
    # At most one pool's run is paused while the other runs: the larger paused state is kept.
    assert shared.room == A100 - CUDA_CONTEXT_BYTES - wan.working - wan.paused - caches
    locked = plan_memory([wan, sdxl], A100, options(device_sharing="run"))
    assert locked.room == shared.room + wan.paused


def test_a_pool_set_whose_paused_state_would_not_fit_is_refused_naming_it():
    big = PoolNeed("video", 10 * GIB, 0, working=4 * GIB, paused=3 * GIB)
    small = PoolNeed("image", 10 * GIB, 0, working=4 * GIB, paused=GIB)
    caches = 2 * options().adapter_cache
    # Room for both pools and one working memory, not for the video's 3 GiB of paused state beside it (while the
    # image runs; the image's own 1 GiB is paused only while the video runs).
    total = CUDA_CONTEXT_BYTES + 4 * GIB + caches + 20 * GIB + 2 * GIB
    assert plan_memory([big, small], total, options(device_sharing="run", pool_offload=False)).resident
    with pytest.raises(SettingsError) as refused:
        plan_memory([big, small], total, options(device_sharing="step", pool_offload=False))
    said = str(refused.value)
    assert "only without step sharing" in said and "video 3.00 GiB" in said and "image 1.00 GiB" in said
    assert "3.00 GiB in all" in said and "accepted: DEVICE_SHARING=run" in said


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_scheduler_is_the_current_device_s():
    current = torch.device("cuda", torch.cuda.current_device())
    assert device_scheduler(torch.device("cuda")) is device_scheduler(current)


def test_a_pool_alone_keeps_no_paused_state():
    alone = PoolNeed("wan", 3 * GIB, 3 * GIB, working=5 * GIB, paused=GIB)
    shared = plan_memory([alone], A100, options(device_sharing="step"))
    assert shared.room == plan_memory([alone], A100, options(device_sharing="run")).room
