"""Civitai LoRAs through the engine: routed by their `baseModel` label, prepared with the checks Hub files get,
keyed by version id, kept in the disk budget, and generating exactly the image the same file gives from the Hub."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.caches.disk import DiskCache
from engine.errors import (
    AdapterLoadError,
    IncompatibleLoraError,
    LimitExceededError,
    UnservedBaseError,
)
from engine.pools.engine import Engine
from engine.pools.pools import Pools
from engine.pools.residency import Residency
from engine.prepare.civitai import CivitaiFiles
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from families.sdxl import ILLUSTRIOUS_BASE, NOOBAI_BASE, PONY_BASE
from lora_catalog.catalog import Catalog
from lora_catalog.civitai.source import CivitaiSource
from lora_catalog.errors import DownloadRefusedError, RestrictedLoraError
from lora_catalog.hub import HubSource
from serving.demo.synthetic import find_targets, make_lora
from tests.support.checks import assert_pristine, generate
from tests.support.loras import SDXL, card, peft_file, sft, with_nan
from tests.support.standin_civitai import StandInCivitai

# Versions by the baseModel label they carry (one LoRA file per family).
SDXL_LABELS = {"SDXL 1.0": 1001, "Pony": 1002, "Illustrious": 1003, "NoobAI": 1004}
OTHER_LABELS = {"SD 1.5": 1005, "Flux.1 D": 1006, "Flux.1 S": 1007, "SD 3.5": 1008, "Wan Video 14B t2v": 1009}


def request(*loras: LoraSpec, seed: int = 3) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", loras=tuple(loras), steps=2, width=64, height=64, seed=seed)


@pytest.fixture(scope="module")
def files(loaded, loaded_sd15) -> dict[str, bytes]:
    sd15_targets = find_targets({"unet": loaded_sd15.pipe.unet}, {"unet": (r"attn1\.to_q$",)})
    return {
        "sdxl": peft_file(loaded.pipe, seed=91),
        "sd15": sft(make_lora(sd15_targets, rank=2, seed=92, fmt="peft", strength=0.5)),
        "nan": with_nan(loaded.pipe),
    }


@pytest.fixture(scope="module")
def civitai(files) -> Iterator[StandInCivitai]:
    with StandInCivitai() as started:
        for label, version in SDXL_LABELS.items():
            started.add_lora(version, files["sdxl"], base_model=label, trained_words=("civstyle",))
        for label, version in OTHER_LABELS.items():
            started.add_lora(version, files["sd15" if label == "SD 1.5" else "sdxl"], base_model=label)
        started.add_lora(1101, files["sdxl"], download="tampered")
        started.add_lora(1102, files["nan"])
        started.add_lora(1103, files["sdxl"], download="login")
        # A page stating CLIP skip 2 (A1111's count), and a speed LoRA known by its model's name.
        started.add_lora(1104, files["sd15"], base_model="SD 1.5", clip_skip=2)
        started.add_lora(1105, files["sdxl"], model_name="DMD2 4-step LoRA")
        # An SDXL version with a high- and a low-noise file: no pair on a one-stage base, its primary file alone.
        grain = {"grain_high_noise.safetensors": files["nan"]}
        started.add_lora(1106, files["sdxl"], name="grain_low_noise.safetensors", more=grain)
        yield started


def civitai_files(civitai: StandInCivitai, folder: Path, max_bytes: int = 2**30) -> CivitaiFiles:
    source = CivitaiSource(civitai.url, timeout_s=5, allowed_hosts=(civitai.storage_host,))
    return CivitaiFiles(source, folder, max_bytes=max_bytes)


def resolver(hub, civitai: StandInCivitai, folder: Path, max_bytes: int = 2**30) -> AdapterResolver:
    return AdapterResolver(
        HubSource(endpoint=hub.url, timeout_s=5),
        local_dir=None,
        token=None,
        max_bytes=max_bytes,
        civitai=civitai_files(civitai, folder, max_bytes),
    )


@pytest.fixture
def pools(loaded, loaded_sd15, base_settings, hub, civitai, tmp_path) -> Iterator[Pools]:
    shared = resolver(hub, civitai, tmp_path / "civitai")
    engines = [
        Engine(loaded, base_settings, shared),
        Engine(loaded_sd15, base_settings.replace(base_model_id=SD15_MODEL_ID), shared),
    ]
    made = Pools(engines, shared, Residency(torch.device("cpu"), None))
    yield made
    made.close()


def pool_of(pools: Pools, ref: str) -> str:
    return pools.route(request(LoraSpec(ref))).pool.base_model_id


# -- routing by baseModel: a test per entry of the table -----------------------------------------------------


@pytest.mark.parametrize("label", list(SDXL_LABELS))
def test_sdxl_shaped_bases_route_to_the_sdxl_pool(pools, label):
    assert pool_of(pools, f"civitai:{SDXL_LABELS[label]}") == SDXL


def test_sd15_routes_to_the_sd15_pool_and_generates_there(pools):
    assert pool_of(pools, "civitai:1005") == SD15_MODEL_ID
    result = generate(pools, request(LoraSpec("https://civitai.com/models/10050?modelVersionId=1005")))
    assert result.adapters[0].ref == "civitai:1005" and result.adapters[0].revision == "1005"


@pytest.mark.parametrize("label", ["Flux.1 D", "Flux.1 S", "SD 3.5", "Wan Video 14B t2v"])
def test_unserved_bases_are_404s_naming_the_served_ones(pools, label):
    with pytest.raises(UnservedBaseError, match=r"served: stabilityai.*stable-diffusion-v1-5") as caught:
        generate(pools, request(LoraSpec(f"civitai:{OTHER_LABELS[label]}")))
    assert caught.value.status == 404
    # A label a family declares names its base (Wan 2.1's since its family joined); another, the label itself.
    known = {"Flux.1 D": "FLUX.1-dev", "Flux.1 S": "FLUX.1-schnell", "Wan Video 14B t2v": "Wan2.1-T2V-14B"}
    named = known.get(label, f"{label} (Civitai)")
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("label", "base"), [("Pony", PONY_BASE), ("Illustrious", ILLUSTRIOUS_BASE), ("NoobAI", NOOBAI_BASE)]
)
def test_a_finetune_runs_on_its_own_pool_where_models_serves_one(
    loaded, base_settings, hub, civitai, tmp_path, label, base
):
    shared = resolver(hub, civitai, tmp_path)
    # Two pools over the one tiny SDXL pipeline, routing only (nothing is generated on them).
    finetune = dataclasses.replace(loaded, base_model_id=base)
    engines = [
        Engine(loaded, base_settings, shared),
        Engine(finetune, base_settings.replace(base_model_id=base), shared),
    ]
    both = Pools(engines, shared, Residency(torch.device("cpu"), None))
    try:
        assert pool_of(both, f"civitai:{SDXL_LABELS[label]}") == base
        assert pool_of(both, f"civitai:{SDXL_LABELS['SDXL 1.0']}") == SDXL
    finally:
        both.close()


def test_a_finetune_on_the_sdxl_pool_says_it_runs_on_another_checkpoint(pools):
    result = generate(pools, request(LoraSpec("civitai:1002")))
    use = result.adapters[0]
    assert use.trained_for == "Pony"
    assert any("trained for Pony, which no pool here serves; it runs on " + SDXL in w for w in result.warnings)
    # The same file declared for SDXL itself runs with no such note.
    plain = generate(pools, request(LoraSpec("civitai:1001")))
    assert plain.adapters[0].trained_for is None and not any("trained for" in w for w in plain.warnings)


def test_a_civitai_pages_clip_skip_and_a_speed_loras_name_are_its_defaults(pools):
    """Civitai's clipSkip is a recommendation like a card's: the default where the client set none."""
    skipped = generate(pools, request(LoraSpec("civitai:1104"))).request
    assert skipped.clip_skip == 1 and dict(skipped.defaults_from)["clip_skip"] == "its Civitai page (clipSkip 2)"
    assert generate(pools, dataclasses.replace(request(LoraSpec("civitai:1104")), clip_skip=0)).request.clip_skip == 0
    fast = generate(pools, request(LoraSpec("civitai:1105"))).request
    # The client's 2 steps stay; the sampler and guidance are DMD2's own.
    assert (fast.steps, fast.sampler, fast.guidance) == (2, "LCM", 0.0)
    assert "DMD2" in dict(fast.defaults_from)["scheduler"]


def test_one_pool_judges_a_civitai_lora_by_its_label_too(hub, civitai, tmp_path, loaded, base_settings):
    engine = Engine(loaded, base_settings, resolver(hub, civitai, tmp_path))
    try:
        with pytest.raises(IncompatibleLoraError, match=r"made for stable-diffusion-v1-5"):
            generate(engine, request(LoraSpec("civitai:1005")))
        assert generate(engine, request(LoraSpec("civitai:1001"))).adapters[0].revision == "1001"
    finally:
        engine.close()


# -- preparation: identity, checks, limits ---------------------------------------------------------------


def test_the_version_id_is_the_identity_in_every_cache(pools, civitai, tmp_path):
    civitai.clear_requests()
    first = generate(pools, request(LoraSpec("urn:air:sdxl:lora:civitai:10010@1001")))
    second = generate(pools, request(LoraSpec("civitai:1001")))
    assert (first.adapters[0].cache, second.adapters[0].cache) == ("miss", "hit")
    assert first.adapters[0].ref == second.adapters[0].ref == "civitai:1001"
    keys = {str(k) for k in pools.default.engine.adapters_in_use()} | {
        str(c.key) for c in pools.default.engine.status().cached
    }
    assert any(k.startswith("civitai:1001@1001:") for k in keys)
    kept = tmp_path / "civitai" / "1001" / "style.safetensors"
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == hashlib.sha256(civitai._versions[1001].data).hexdigest()
    downloads = [r for r in civitai.requests if r.path.startswith("/api/download/")]
    assert len(downloads) == 1, "the second request found the file in the cache"


def test_a_hash_mismatch_is_refused_and_the_pipeline_is_unchanged(pools, loaded, pristine):
    with pytest.raises(DownloadRefusedError, match=r"not the .* its API gave") as caught:
        generate(pools, request(LoraSpec("civitai:1101")))
    assert caught.value.status == 502
    assert_pristine(loaded, pristine)


def test_a_civitai_file_gets_the_checks_hub_files_get(pools):
    with pytest.raises(AdapterLoadError, match=r"NaN|non-finite|nan"):
        generate(pools, request(LoraSpec("civitai:1102")))


def test_a_download_needing_a_login_is_a_403(pools):
    with pytest.raises(RestrictedLoraError) as caught:
        generate(pools, request(LoraSpec("civitai:1103")))
    assert caught.value.status == 403


def test_the_size_limit_applies_before_any_download(hub, civitai, tmp_path, loaded, base_settings):
    engine = Engine(loaded, base_settings, resolver(hub, civitai, tmp_path, max_bytes=1024))
    civitai.clear_requests()
    try:
        with pytest.raises(LimitExceededError, match=r"accepted: files up to 0\.00 MiB"):
            generate(engine, request(LoraSpec("civitai:1004")))
    finally:
        engine.close()
    assert not any(r.path.startswith(("/api/download/", "/storage/")) for r in civitai.requests)


def test_civitai_files_share_the_disk_budget_and_are_pruned_least_recently_used(pools, tmp_path):
    generate(pools, request(LoraSpec("civitai:1003")))
    generate(pools, request(LoraSpec("civitai:1004")))
    folder = tmp_path / "civitai"
    assert {p.name for p in folder.iterdir()} >= {"1003", "1004"}
    disk = DiskCache(0, cache_dir=tmp_path / "no-hub-cache", civitai_dir=folder)
    assert disk.lora_bytes() >= 2 * (folder / "1003" / "style.safetensors").stat().st_size
    with disk.hold(pools.default.engine.resolver.locate(LoraSpec("civitai:1004")).key):
        report = disk.prune()
    assert "civitai:1004" in report.kept_in_use and "civitai:1003" in report.deleted
    assert not (folder / "1003").exists() and (folder / "1004").exists()
    # A pruned file is downloaded again when asked for (its metadata is still cached).
    assert generate(pools, request(LoraSpec("civitai:1003"))).adapters[0].cache == "hit"


# -- one reference image ------------------------------------------------------------------------------------


def test_a_civitai_lora_gives_the_image_the_same_file_gives_from_the_hub(pools, hub, files):
    hub.add_repo("civitai-twin/sdxl", {"README.md": card(SDXL), "style.safetensors": files["sdxl"]})
    from_hub = generate(pools, request(LoraSpec("civitai-twin/sdxl"), seed=11))
    from_civitai = generate(pools, request(LoraSpec("civitai:1001"), seed=11))
    assert from_hub.adapters[0].cache == "miss" and from_civitai.adapters[0].ref == "civitai:1001"
    assert np.array_equal(np.asarray(from_hub.image), np.asarray(from_civitai.image))


def test_an_sdxl_version_with_high_and_low_noise_files_is_the_single_lora_of_its_primary_file(pools, civitai):
    civitai.clear_requests()
    grain = generate(pools, request(LoraSpec("civitai:1106"), seed=11))
    plain = generate(pools, request(LoraSpec("civitai:1001"), seed=11))
    assert grain.adapters[0].weight_name == "grain_low_noise.safetensors"
    assert np.array_equal(np.asarray(grain.image), np.asarray(plain.image))
    assert not [r for r in civitai.requests if "file" in r.query or "grain_high" in r.path], "its other file is unused"


def test_the_catalogue_describes_a_civitai_lora_with_its_trigger_words(hub, civitai):
    catalog = Catalog(HubSource(endpoint=hub.url, timeout_s=5), civitai=CivitaiSource(civitai.url, timeout_s=5))
    try:
        entry = catalog.resolve("https://civitai.com/models/10010?modelVersionId=1001")
        assert entry.trigger_words == ("civstyle",) and entry.source == "civitai" and entry.ref == "civitai:1001"
    finally:
        catalog.close()
