"""A pair's size limit is on the sum of its two files, even when one half's size is unknown in advance, and the load
gate holds the sizes that were checked (issue 47, item 16). A Hub file whose size the repo's metadata lacks is
measured by a HEAD before anything is downloaded; a Civitai file its API gave no size for is measured once
downloaded, before anything is read. Before the fix each half was checked alone (so two halves of 0.9 times the
limit loaded) and the gate held 0 bytes for them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file, save

from engine.errors import LimitExceededError
from engine.pools.engine import Engine
from engine.prepare.civitai import CivitaiFiles
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.civitai.source import CivitaiSource
from lora_catalog.entries import LoraEntry
from lora_catalog.hub import HubSource
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine
from tests.support.standin_civitai import StandInCivitai
from tests.support.wan import CASES, PROMPT, write_wan_loras

HIGH, LOW = "style_high_noise.safetensors", "style_low_noise.safetensors"
REPO, CIVITAI_PAIR = "sizes/one-pair", 4301
BOTH = ("transformer", "transformer_2")


class SizelessHub:
    """The real catalogue over the stand-in Hub, answering without file sizes, as it does for a file whose size
    the Hub's metadata lacks (`lora_catalog.hub`: a pair's size is then None)."""

    def __init__(self, hub: HubSource) -> None:
        self._hub = hub

    def resolve(self, ref: str, revision: str | None = None, weight_name: str | None = None) -> LoraEntry:
        return dataclasses.replace(self._hub.resolve(ref, revision, weight_name), weight_size=None)

    def stale_warning(self, ref: str, revision: str | None = None, weight_name: str | None = None) -> str | None:
        return None


@pytest.fixture(scope="module")
def halves(loaded_wan22, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("pair-sizes")
    write_wan_loras(loaded_wan22.pipe, folder, CASES[:2])
    return {name: save(load_file(folder / case.file_name)) for name, case in zip((HIGH, LOW), CASES[:2], strict=True)}


@pytest.fixture(scope="module")
def published(hub, halves) -> None:
    hub.add_repo(REPO, halves)


@pytest.fixture(scope="module")
def civitai(halves) -> Iterator[StandInCivitai]:
    with StandInCivitai() as started:
        document = started.add_lora(
            CIVITAI_PAIR, halves[HIGH], name=HIGH, base_model="Wan Video 2.2 T2V-A14B", more={LOW: halves[LOW]}
        )
        # The low half's size is unknown: Civitai's API gives none for it.
        del next(f for f in document["files"] if f["name"] == LOW)["sizeKB"]
        yield started


def make_engine(loaded, settings, hub, civitai, cache: Path, max_bytes: int) -> Engine:
    source = CivitaiSource(civitai.url, timeout_s=5, allowed_hosts=(civitai.storage_host,))
    resolver = AdapterResolver(
        SizelessHub(HubSource(endpoint=hub.url, timeout_s=5)),
        local_dir=None,
        token=None,
        max_bytes=max_bytes,
        cache_dir=cache / "hub",
        civitai=CivitaiFiles(source, cache / "civitai", max_bytes=max_bytes),
    )
    return Engine(loaded, settings.replace(base_model_id=loaded.base_model_id, max_adapter_bytes=max_bytes), resolver)


def request(spec: LoraSpec) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=(spec,), steps=1, width=64, height=64, seed=7, num_frames=5)


PAIRS = {"a Hub pair": LoraSpec(REPO), "a Civitai pair": LoraSpec(f"civitai:{CIVITAI_PAIR}")}


@pytest.mark.parametrize("spec", PAIRS.values(), ids=PAIRS.keys())
def test_a_pair_over_the_limit_together_is_refused_though_a_halfs_size_is_unknown(
    loaded_wan22, pristine_wan22, base_settings, hub, civitai, halves, published, tmp_path, spec
):
    # Each half alone is within the limit; the two together are not.
    limit = max(len(data) for data in halves.values()) + 1024
    assert sum(len(data) for data in halves.values()) > limit
    engine = make_engine(loaded_wan22, base_settings, hub, civitai, tmp_path, limit)
    hub.clear_requests()
    try:
        with pytest.raises(LimitExceededError, match=rf"LoRA '{spec.ref}' \(.*{HIGH}\+.*{LOW}\) is .*; accepted"):
            generate(engine, request(spec))
        assert engine._preparer._gates["request"].peaks[1] <= limit  # type: ignore[union-attr]
        engine.restore_base_weights()
    finally:
        engine.close()
    assert_components_pristine(loaded_wan22.pipe, pristine_wan22, BOTH)
    # The Hub's sizes were asked for (HEAD) and nothing was downloaded.
    assert not [r for r in hub.requests if r.method == "GET" and r.path.endswith((HIGH, LOW))]


SIZES = {**PAIRS, "a Hub file": LoraSpec(REPO, weight_name=HIGH)}


@pytest.mark.parametrize("spec", SIZES.values(), ids=SIZES.keys())
def test_the_load_gate_holds_the_checked_sizes(
    loaded_wan22, base_settings, hub, civitai, halves, published, tmp_path, spec
):
    engine = make_engine(loaded_wan22, base_settings, hub, civitai, tmp_path, 2**30)
    try:
        generate(engine, request(spec))
        _, peak_bytes = engine._preparer._gates["request"].peaks  # type: ignore[union-attr]
    finally:
        engine.close()
    files = (HIGH,) if spec.weight_name else (HIGH, LOW)
    assert peak_bytes == sum(len(halves[name]) for name in files)
