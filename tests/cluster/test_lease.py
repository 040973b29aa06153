"""A replica's lease and the engine's cache name each adapter alike, for every kind of reference (no Ray).

Serve's LRU (`AdapterPin`) and our router's "prepared" sets trust the lease: a key the engine does not use
would say an adapter is held while the engine may evict it (a Civitai LoRA was leased as a Hub repo).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.pools.engine import Engine
from engine.prepare.civitai import CivitaiFiles
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.civitai.source import CivitaiSource
from lora_catalog.hub import HubSource
from serving.cluster.replica import AdapterPin, lease_keys
from serving.cluster.stats import SetBook
from tests.support.checks import generate
from tests.support.loras import peft_file
from tests.support.standin_civitai import StandInCivitai

REFS = {
    "hub": lambda fixtures: fixtures.repos["peft"],
    "local": lambda fixtures: fixtures.local["kohya"],
    "civitai version": lambda fixtures: "civitai:3001",
    "civitai model": lambda fixtures: "civitai:models/30020",
    "civitai link": lambda fixtures: "https://civitai.com/models/30030?modelVersionId=3003",
    "AIR": lambda fixtures: "urn:air:sdxl:lora:civitai:30040@3004",
}


@pytest.fixture(scope="module")
def civitai(loaded) -> Iterator[StandInCivitai]:
    with StandInCivitai() as started:
        for offset, version in enumerate((3001, 3002, 3003, 3004)):
            started.add_lora(version, peft_file(loaded.pipe, seed=60 + offset))
        yield started


@pytest.fixture
def engine(loaded, base_settings, hub, civitai, tmp_path) -> Iterator[Engine]:
    source = CivitaiSource(civitai.url, timeout_s=5, allowed_hosts=(civitai.storage_host,))
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url, timeout_s=5),
        local_dir=base_settings.local_lora_dir,
        token=None,
        max_bytes=2**30,
        civitai=CivitaiFiles(source, tmp_path / "civitai", max_bytes=2**30),
    )
    made = Engine(loaded, base_settings, resolver)
    yield made
    made.close()


@pytest.mark.parametrize("kind", list(REFS))
def test_the_lease_holds_the_keys_the_engine_cached(engine, fixtures, kind):
    spec = LoraSpec(REFS[kind](fixtures))
    result = generate(engine, GenerateRequest(prompt="a fox", loras=(spec,), steps=1, width=64, height=64, seed=1))
    keys = lease_keys(result)
    cached = {c.key for c in engine.status().cached}
    assert len(keys) == 1 and set(keys) <= cached, (keys, cached)
    # Held by Serve's model object, then let go on its eviction: the engine's cache follows the lease.
    pin = AdapterPin(engine, "set", SetBook())
    pin.hold(keys)
    engine.restore_base_weights()  # the swap lets go of its adapters
    pin.__del__()
    assert not set(keys) & {c.key for c in engine.status().cached}
