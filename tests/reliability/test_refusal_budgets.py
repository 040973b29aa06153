"""Budgets that hold when LoRAs are refused (issue 20, defect 2, and the preparer's per-key locks).

Before the fix the Hub cache was pruned only after a successful preparation, and routing's origin check
downloaded without holding or pruning: refused LoRAs filled the disk past `DISK_CACHE_BYTES`. Each test here
waits for the background pruning the engine scheduled itself; none prunes by hand.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
import torch

from engine.errors import SwitchboardError
from engine.pools.engine import Engine
from engine.pools.pools import Pools
from engine.pools.residency import Residency
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from lora_catalog.hub import HubSource
from tests.support.checks import generate
from tests.support.loras import card, peft_file

# Each is downloaded, then refused: rank over MAX_RANK, NaN values, factors that fit no weight, names that match
# no module, an unsupported variant, SD 1.5 metadata, a header lying about a shape, infinities.
REFUSED_AFTER_DOWNLOAD = ("high-rank", "nan", "wrong-shapes", "unknown-keys", "oft", "sd15-meta", "lying-shape", "inf")


def request(*refs: str) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", steps=1, seed=3, loras=tuple(LoraSpec(r) for r in refs))


@pytest.fixture
def resolver(clean_hub, base_settings, tmp_path) -> AdapterResolver:
    return AdapterResolver(
        HubSource(endpoint=clean_hub.url, timeout_s=5),
        local_dir=None,
        token=None,
        max_bytes=base_settings.max_adapter_bytes,
        cache_dir=tmp_path / "hf-cache",
    )


def test_refused_downloads_are_pruned_to_the_disk_budget(loaded, base_settings, fixtures, resolver):
    one_file = 64 * 2**10
    engine = Engine(loaded, base_settings.replace(disk_cache_bytes=one_file), resolver)
    try:
        for role in REFUSED_AFTER_DOWNLOAD:
            with pytest.raises(SwitchboardError):
                generate(engine, request(fixtures[role]))
        assert engine.disk_cache is not None
        assert engine.disk_cache.wait_idle(60)
        assert engine.disk_cache.lora_bytes() <= one_file
    finally:
        engine.close()


def test_routing_downloads_are_held_and_pruned(loaded, loaded_sd15, base_settings, clean_hub, resolver):
    # No card base: routing reads each file's header (a download) to tell the pools apart.
    repos = [f"refusals/shapes-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    for seed, repo in enumerate(repos):
        clean_hub.add_repo(repo, {"README.md": card(None), "lora.safetensors": peft_file(loaded.pipe, seed=80 + seed)})
    one_file = 64 * 2**10
    settings = base_settings.replace(disk_cache_bytes=one_file)
    engines = [
        Engine(loaded, settings, resolver),
        Engine(loaded_sd15, settings.replace(base_model_id=SD15_MODEL_ID), resolver),
    ]
    pools = Pools(engines, resolver, Residency(torch.device("cpu"), None))
    try:
        for repo in repos:
            assert pools.route(request(repo)).pool.index == 0
        disk = engines[0].disk_cache
        assert disk is not None and disk.wait_idle(60)
        assert disk.lora_bytes() <= one_file
    finally:
        for engine in reversed(engines):
            engine.close()


def test_the_per_key_locks_do_not_outlive_their_preparations(make_engine, fixtures):
    engine = make_engine()
    for role in ("peft", "kohya", "second", "high-rank", "nan", "peft"):
        with contextlib.suppress(SwitchboardError):
            generate(engine, request(fixtures[role]))
    assert engine._preparer._key_locks == {}
