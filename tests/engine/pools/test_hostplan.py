"""The plan's host side (issue 28, 3): what a plan places in host RAM fits HOST_RAM_BYTES, at start-up and per
request, and a plan that cannot fit is refused naming what would."""

from __future__ import annotations

import pytest
import torch

from engine.errors import LimitExceededError, SettingsError
from engine.pools.engine import Engine
from engine.pools.plan import PlanOptions, PoolNeed, declared_needs, plan_memory
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import DEFAULT_MODEL_ID, PoolSetting, Settings
from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID
from lora_catalog.hub import HubSource
from tests.reliability.test_budgets import plain
from tests.support.checks import generate

GIB = 2**30
L40S = 46_068 * 2**20
A10G = 23_028 * 2**20
FLUX = PoolNeed(
    "black-forest-labs/FLUX.1-dev",
    weights=2 * (11_901_408_320 + 4_762_310_656 + 123_060_557 + 83_819_683),
    touchable=2 * (11_901_408_320 + 123_060_557),
    host_able=(("text_encoder_2", 2 * 4_762_310_656),),
)


def options(host_ram: int, **changes: object) -> PlanOptions:
    settings = Settings(dtype="auto", device="cpu").replace(host_ram_bytes=host_ram, **changes)
    return PlanOptions.of(settings)


def test_flux_s_pristine_copies_in_host_ram_get_what_host_ram_bytes_leaves_them():
    """A LoRA adapting all of FLUX's transformer would have pinned 22.4 GiB, whatever the host had."""
    roomy = plan_memory([FLUX], L40S, options(64 * GIB)).placements[0]
    assert roomy.pristine_store == "cpu" and roomy.host_pristine == FLUX.touchable
    (tight,) = plan_memory([FLUX], L40S, options(16 * GIB)).placements
    # HOST_CACHE_BYTES (4 GiB) first; the copies get the rest.
    assert tight.host_pristine == 12 * GIB and tight.host_bytes == 16 * GIB
    assert "host RAM 16.00 GiB of 16.00 GiB" in plan_memory([FLUX], L40S, options(16 * GIB)).describe()


def test_a_plan_that_cannot_fit_host_ram_bytes_is_refused_at_start_up_naming_what_would():
    with pytest.raises(SettingsError) as refused:
        plan_memory([FLUX], L40S, options(4 * GIB + 512 * 2**20))
    message = str(refused.value)
    assert "does not fit HOST_RAM_BYTES (4.50 GiB)" in message
    assert "HOST_CACHE_BYTES 4.00 GiB, pristine copies at least 1.00 GiB" in message
    assert (
        "accepted: HOST_RAM_BYTES of at least 5120MiB (a machine with more RAM); or HOST_CACHE_BYTES=3584MiB" in message
    )
    # A PRISTINE_BYTES that is set is kept whole, never shrunk: it must fit as set.
    with pytest.raises(SettingsError, match=r"HOST_RAM_BYTES \(12\.00 GiB\)"):
        plan_memory([FLUX], L40S, options(12 * GIB, pristine_bytes=10 * GIB))


def test_pools_taking_turns_count_their_pinned_host_buffers():
    settings = Settings(dtype="auto", device="cpu", pools=(PoolSetting(ZIMAGE_MODEL_ID, ZIMAGE_MODEL_ID),))
    beside = settings.replace(pools=(*settings.pools, PoolSetting(DEFAULT_MODEL_ID, DEFAULT_MODEL_ID)))
    needs = declared_needs(beside, torch.device("cuda"))
    assert needs is not None
    plan = plan_memory(needs, A10G, options(46 * GIB))
    assert not plan.resident
    weights_on_device = sum(p.weights for p in plan.placements)
    qwen3 = dict(needs[0].host_able)["text_encoder"]
    assert plan.host_bytes >= weights_on_device + qwen3 + 2 * 4 * GIB
    # On a 15 GB a10g-small there is no room for both pools waiting in host RAM.
    with pytest.raises(SettingsError, match="does not fit HOST_RAM_BYTES"):
        plan_memory(needs, A10G, options(12 * GIB))


def test_a_lora_whose_pristine_copies_pass_the_host_budget_is_refused_naming_it_and_changes_nothing(
    loaded, base_settings, hub, fixtures
):
    resolver = AdapterResolver(HubSource(endpoint=hub.url, timeout_s=2), local_dir=None, token=None, max_bytes=2**30)
    engine = Engine(loaded, base_settings, resolver, host_pristine=1024)
    try:
        base = generate(engine, plain()).image.tobytes()
        with pytest.raises(LimitExceededError, match=r"budget of 0\.0 MiB \(HOST_RAM_BYTES\)"):
            generate(engine, plain(fixtures["peft"]))
        assert generate(engine, plain()).image.tobytes() == base
        assert engine.status().pristine_bytes == 0 and engine.status().pristine_budget == 1024
    finally:
        engine.close()


def test_start_up_refuses_what_host_ram_cannot_hold_and_gives_each_engine_its_host_budget(
    loaded, base_settings, monkeypatch
):
    from engine.pools import pools as pools_module

    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    settings = base_settings.replace(local_lora_dir=None, pristine_store="cpu", host_cache_bytes=GIB)
    load = lambda s, **_: loaded  # noqa: E731
    with pytest.raises(SettingsError, match=r"does not fit HOST_RAM_BYTES \(1\.00 GiB\)"):
        build_pools(settings.replace(host_ram_bytes=GIB), resolver, load, warm=False, memory=lambda _: 64 * GIB)
    given: list[int | None] = []

    def engine(*args: object, host_pristine: int | None = None, **kwargs: object) -> Engine:
        given.append(host_pristine)
        return Engine(*args, host_pristine=host_pristine, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pools_module, "Engine", engine)
    pools = build_pools(settings.replace(host_ram_bytes=2 * GIB), resolver, load, warm=False, memory=lambda _: 64 * GIB)
    try:
        touchable = sum(p.nbytes for c in loaded.family.components for p in getattr(loaded.pipe, c).parameters())
        assert given == [pytest.approx(touchable, rel=0.01)]
    finally:
        pools.close()


def test_a_pool_with_nothing_touchable_that_outgrows_host_ram_is_refused_naming_it():
    """Issue 31: a quantized pool keeps no pristine copies; its host RAM's shortfall divided by zero."""
    nothing_touchable = PoolNeed("quantized", weights=2 * GIB, touchable=0)
    with pytest.raises(SettingsError, match=r"does not fit HOST_RAM_BYTES \(1\.00 GiB\)"):
        plan_memory([nothing_touchable], L40S, options(GIB))
