"""Bounded resources (pristine copies, host cache, Hub disk cache) and stale-while-revalidate for adapters."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_hub_download
from safetensors.torch import save

from engine.caches.disk import DiskCache
from engine.errors import LimitExceededError
from engine.formats.adapters import AdapterKey
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.hub import HubSource
from serving.demo.synthetic import find_targets, make_lora
from tests.support.checks import generate
from tests.support.loras import WEIGHTS
from tests.support.waits import wait_until


def plain(*loras: str, **fields: object) -> GenerateRequest:
    specs = tuple(LoraSpec(ref) for ref in loras)
    return GenerateRequest(**{"prompt": "a fox", "steps": 1, "seed": 3, "loras": specs, **fields})  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def built(loaded, base_settings, hub, tmp_path):
    """Engines over their own Hub cache folder (so pruning it touches nothing else), closed after the test."""
    made: list[tuple[Engine, HubSource]] = []

    def build(clock=time.monotonic, cache: Path | None = None, **overrides: object) -> Engine:
        settings = base_settings.replace(**overrides)
        source = HubSource(endpoint=hub.url, timeout_s=2, clock=clock)
        resolver = AdapterResolver(
            source,
            local_dir=settings.local_lora_dir,
            token=None,
            max_bytes=settings.max_adapter_bytes,
            cache_dir=cache or tmp_path / "hf-cache",
            timeout_s=2,
        )
        engine = Engine(loaded, settings, resolver)
        made.append((engine, source))
        return engine

    yield build
    for engine, source in reversed(made):
        if engine.disk_cache is not None:
            engine.disk_cache.wait_idle(30)
        engine.close()
        source.close()


# -- pristine copies --------------------------------------------------------------------------------------------


@pytest.fixture
def ff_lora(loaded, tmp_path) -> Path:
    """A local LoRA on the UNet's feed-forward and conv layers only: weights the attention LoRAs never touch."""
    pipe = loaded.pipe
    targets = find_targets({"unet": pipe.unet}, {"unet": (r"ff\.net\.(0\.proj|2)$", r"resnets\.\d+\.conv[12]$")})
    folder = tmp_path / "local"
    folder.mkdir()
    (folder / "ff.safetensors").write_bytes(save(make_lora(targets, rank=4, seed=41, fmt="peft", strength=0.2)))
    return folder


def test_pristine_copies_stay_in_budget_and_restores_stay_bit_exact(built, fixtures, ff_lora, loaded, pristine):
    probe = built(local_lora_dir=ff_lora)
    base = generate(probe, plain()).image.tobytes()
    generate(probe, plain(fixtures["peft"]))
    attention = probe.status().pristine_bytes
    generate(probe, plain("local:ff.safetensors"))
    union = probe.status().pristine_bytes
    probe.close()
    ff = union - attention
    assert attention > 0 and ff > 0
    budget = max(attention, ff)
    engine = built(local_lora_dir=ff_lora, pristine_bytes=budget)
    for refs in ([fixtures["peft"]], ["local:ff.safetensors"], [fixtures["peft"]], [], ["local:ff.safetensors"], []):
        generate(engine, plain(*refs))
        assert engine.status().pristine_bytes <= budget
    assert generate(engine, plain()).image.tobytes() == base
    for name in ("unet", "text_encoder", "text_encoder_2"):
        for key, value in getattr(loaded.pipe, name).state_dict().items():
            assert value.equal(pristine[f"{name}.{key}"]), f"{name}.{key} differs from the base"


def test_a_set_larger_than_the_pristine_budget_is_refused_and_changes_nothing(built, fixtures):
    engine = built(pristine_bytes=1024)
    base = generate(engine, plain()).image.tobytes()
    with pytest.raises(LimitExceededError, match="PRISTINE_BYTES"):
        generate(engine, plain(fixtures["peft"]))
    assert generate(engine, plain()).image.tobytes() == base
    assert engine.status().pristine_bytes == 0


# -- the Hub disk cache -------------------------------------------------------------------------------------------


def _download(repo: str, cache: Path, weight: str = WEIGHTS) -> Path:
    return Path(hf_hub_download(repo, weight, cache_dir=cache))


def test_the_disk_cache_prunes_least_recently_read_and_spares_kept_and_in_use(clean_hub, fixtures, tmp_path):
    cache = tmp_path / "hf"
    files = {role: _download(fixtures[role], cache) for role in ("peft", "second", "peft-noalpha", "high-rank")}
    # Last read: peft (oldest) ... high-rank (newest); peft is in use and second is the served model's repo.
    for age, role in enumerate(("peft", "second", "peft-noalpha", "high-rank")):
        blob = files[role].resolve()
        os.utime(blob, (1_000_000 + age * 1000, blob.stat().st_mtime))
    sha_of = {role: path.parent.name for role, path in files.items()}
    in_use = {AdapterKey("hub", fixtures["peft"], sha_of["peft"], WEIGHTS)}
    budget = files["high-rank"].stat().st_size + files["peft"].stat().st_size  # the kept repo is not counted
    disk = DiskCache(budget, cache_dir=cache, keep_repos={fixtures["second"]}, in_use=lambda: in_use)
    report = disk.prune()
    assert report.deleted == (f"{fixtures['peft-noalpha']}@{sha_of['peft-noalpha'][:10]}",)
    assert report.kept_in_use == (f"{fixtures['peft']}@{sha_of['peft'][:10]}",)
    assert files["peft"].is_file() and files["second"].is_file() and files["high-rank"].is_file()
    assert not files["peft-noalpha"].exists()
    assert disk.lora_bytes() <= budget


def test_a_held_revision_is_never_deleted(clean_hub, fixtures, tmp_path):
    cache = tmp_path / "hf"
    path = _download(fixtures["peft"], cache)
    key = AdapterKey("hub", fixtures["peft"], path.parent.name, WEIGHTS)
    disk = DiskCache(0, cache_dir=cache)
    with disk.hold(key):
        assert disk.prune().deleted == ()
        assert path.is_file()
    assert disk.prune().deleted == (f"{fixtures['peft']}@{key.revision[:10]}",)
    assert not path.exists()


# -- stale-while-revalidate -----------------------------------------------------------------------------------


def test_after_the_ttl_with_the_hub_down_a_cached_lora_still_serves_with_a_warning(built, clean_hub, fixtures):
    clock = Clock()
    engine = built(clock=clock)
    first = generate(engine, plain(fixtures["peft"]))
    assert first.warnings == ()
    clock.now += 601  # past the catalogue's 10-minute metadata TTL
    clean_hub.set_fault("down")
    served = generate(engine, plain(fixtures["peft"]))
    assert served.image.tobytes() == first.image.tobytes()
    assert any("served from Hub metadata" in w for w in served.warnings), served.warnings

    # The revalidation runs in the background, fails, and the next result says why.
    def says_why() -> bool:
        return any("could not be reached" in w for w in generate(engine, plain(fixtures["peft"])).warnings)

    wait_until(says_why, "a result saying the Hub could not be reached", poll=0.2)
    clean_hub.set_fault(None)
    clock.now += 61  # past the retry delay: the next request revalidates, and then it is fresh again
    generate(engine, plain(fixtures["peft"]))
    wait_until(lambda: generate(engine, plain(fixtures["peft"])).warnings == (), "a result with no warning", poll=0.2)


def test_revalidation_is_off_the_request_path(built, clean_hub, fixtures):
    clock = Clock()
    engine = built(clock=clock)
    generate(engine, plain(fixtures["kohya"]))
    clock.now += 601
    clean_hub.set_fault("slow", delay_s=5.0, paths="/api/models")
    started = time.perf_counter()
    generate(engine, plain(fixtures["kohya"]))
    assert time.perf_counter() - started < 4.0


@pytest.mark.parametrize("how", ["hub down", "HF_HUB_OFFLINE"])
def test_a_lora_on_disk_serves_after_a_restart_without_the_hub(built, clean_hub, fixtures, tmp_path, monkeypatch, how):
    cache = tmp_path / "shared-cache"
    first = built(cache=cache)
    before = generate(first, plain(fixtures["second"]))
    first.close()  # the process "ends": base weights back, so the next engine snapshots the true base
    if how == "hub down":
        clean_hub.set_fault("down")
    else:
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    restarted = built(cache=cache)  # nothing in memory: metadata and adapters are gone with the old process
    after = generate(restarted, plain(fixtures["second"]))
    assert after.image.tobytes() == before.image.tobytes()
    assert any("served from the local Hub cache" in w for w in after.warnings), after.warnings


# -- every budget after a long mixed run ------------------------------------------------------------------------


def test_budgets_hold_after_a_long_mixed_run(built, clean_hub, fixtures, tmp_path):
    roles = ("peft", "kohya", "second", "peft-noalpha", "high-rank")
    cache = tmp_path / "long-cache"
    probe = built(cache=tmp_path / "probe-cache")
    generate(probe, plain(fixtures["kohya"]))
    pristine_budget = probe.status().pristine_bytes  # the largest set below touches exactly these weights
    probe.close()
    weights = {"kohya": "ohwx_style.safetensors"}
    sizes = [_download(fixtures[r], tmp_path / "sizes", weights.get(r, WEIGHTS)).stat().st_size for r in roles]
    host_budget = 3 * max(sizes)  # float32 files, float32 compute: host bytes are about the file sizes
    engine = built(
        cache=cache,
        host_cache_bytes=host_budget,
        pristine_bytes=pristine_budget,
        disk_cache_bytes=2 * max(sizes),
        max_rank=64,
    )
    plan = [(roles[i % 5],) if i % 3 else (roles[i % 5], roles[(i + 2) % 5]) for i in range(15)] + [()]
    for refs in plan:
        generate(engine, plain(*(fixtures[r] for r in refs)))
        status = engine.status()
        assert status.host_bytes <= host_budget
        assert status.pristine_bytes <= pristine_budget
        assert status.device_bytes <= status.device_budget
    assert engine.disk_cache is not None
    engine.disk_cache.wait_idle(60)
    engine.disk_cache.prune()
    assert engine.disk_cache.lora_bytes() <= 2 * max(sizes)
