"""Catalog: snapshot first, live list after, offline fallbacks, caching, paging and snapshots on disk."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save

from families.krea2 import MODEL_ID as KREA2_TURBO
from families.krea2 import RAW_ID as KREA2_RAW
from families.qwen_image import MODEL_ID as QWEN_IMAGE
from lora_catalog import (
    Catalog,
    Family,
    HubSource,
    HubUnavailableError,
    InvalidRequestError,
    LoraEntry,
    Snapshot,
    SnapshotError,
    read_snapshot,
    write_snapshot,
)
from lora_catalog.bases import KNOWN_BASES
from tests.support.standin_hub import StandInHub

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
NS = "cat-facade"
SNAPSHOT_TIME = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
# name -> (downloads, likes)
LIVE = {"alpha-xl": (300, 1), "beta-xl": (200, 3), "gamma-xl": (100, 2)}
# Krea 2 adapters: name -> (the base its card names, downloads). Qwen-Image's shares diffusers' attention names.
KREA2 = {
    "ink-krea2": (KREA2_RAW, 40),
    "grain-krea2": (KREA2_RAW, 30),
    "speed-krea2-turbo": (KREA2_TURBO, 20),
    "qwen-lookalike": (QWEN_IMAGE, 90),
}


def card(base: str = SDXL) -> bytes:
    data = {"base_model": base, "tags": ["lora"], "license": "openrail++"}
    return f"---\n{yaml.safe_dump(data)}---\n".encode()


def weights() -> bytes:
    return save({"lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": np.ones((2, 4), np.float32)})


def krea2_weights() -> bytes:
    return save({"diffusion_model.blocks.0.attn.wq.lora_A.weight": np.ones((2, 4), np.float32)})


def snap_entry(name: str, *, family: Family = Family.SDXL, downloads: int = 0, likes: int = 0) -> LoraEntry:
    return LoraEntry(
        ref=f"{NS}/{name}",
        repo_id=f"{NS}/{name}",
        title=name,
        base_models=(SDXL if family is Family.SDXL else SD15,),
        family=family,
        downloads=downloads,
        likes=likes,
        tags=("lora", "watercolor") if "water" in name else ("lora",),
    )


SNAPSHOT_ENTRIES = (
    snap_entry("old-watercolor", downloads=50, likes=9),
    snap_entry("old-pixel", downloads=70, likes=1),
    snap_entry("old-ink", downloads=60, likes=5),
    snap_entry("old-sd15", family=Family.SD15, downloads=999, likes=99),
)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    with StandInHub(tmp_path_factory.mktemp("catalog-facade-hub")) as started:
        for name, (downloads, likes) in LIVE.items():
            started.add_repo(
                f"{NS}/{name}", {"README.md": card(), "x.safetensors": weights()}, downloads=downloads, likes=likes
            )
        started.add_repo(f"{NS}/sd15-only", {"README.md": card(SD15), "x.safetensors": weights()}, downloads=5)
        for name, (base, downloads) in KREA2.items():
            files = {"README.md": card(base), "lora.safetensors": krea2_weights()}
            started.add_repo(f"{NS}/{name}", files, downloads=downloads)
        yield started


@pytest.fixture
def snapshot_path(tmp_path: Path) -> Path:
    path = tmp_path / "snapshots" / "sdxl.json"
    write_snapshot(path, Snapshot.of(SDXL, SNAPSHOT_TIME, SNAPSHOT_ENTRIES))
    return path


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def closed_port_url() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def titles(page) -> list[str]:
    return [e.title for e in page.entries]


def test_first_page_is_the_snapshot_then_the_live_list(clean_hub: StandInHub, snapshot_path: Path) -> None:
    # A slow Hub: had page() waited for it, the first page would already be live.
    clean_hub.set_fault("slow", delay_s=0.5)
    with Catalog(HubSource(endpoint=clean_hub.url, timeout_s=5.0), snapshot_path=snapshot_path) as catalog:
        first = catalog.page(SDXL)
        assert titles(first) == ["old-pixel", "old-ink", "old-watercolor"]
        assert first.freshness.source == "snapshot"
        assert first.freshness.updated_at == SNAPSHOT_TIME
        assert not first.freshness.offline
        assert first.freshness.message == "Showing the snapshot of 2026-11-30 12:00 UTC while the Hub list loads"
        assert catalog.wait_idle(timeout=30)
        later = catalog.page(SDXL)
    assert titles(later) == ["alpha-xl", "beta-xl", "gamma-xl"]
    assert (later.freshness.source, later.freshness.offline) == ("hub", False)
    assert later.freshness.message == "Live from the Hub, updated just now"
    assert len(clean_hub.requests) == 1


def test_snapshot_only_catalog_searches_sorts_and_pages_locally(snapshot_path: Path) -> None:
    catalog = Catalog(None, snapshot_path=snapshot_path)
    page = catalog.page(SDXL, sort="likes")
    assert titles(page) == ["old-watercolor", "old-ink", "old-pixel"]  # the SD 1.5 entry is another family
    assert page.freshness.offline
    assert page.freshness.message == "Offline: showing the snapshot of 2026-11-30 12:00 UTC"
    assert titles(catalog.page(SDXL, search="WATER")) == ["old-watercolor"]
    assert titles(catalog.page(SD15)) == ["old-sd15"]
    first = catalog.page(SDXL, page=0, page_size=2)
    second = catalog.page(SDXL, page=1, page_size=2)
    beyond = catalog.page(SDXL, page=5, page_size=2)
    assert (titles(first), first.total_known, first.has_more) == (["old-pixel", "old-ink"], 3, True)
    assert (titles(second), second.has_more) == (["old-watercolor"], False)
    assert (beyond.entries, beyond.has_more) == ((), False)


def test_offline_start_with_the_hub_unreachable(snapshot_path: Path) -> None:
    with Catalog(HubSource(endpoint=closed_port_url(), timeout_s=2.0), snapshot_path=snapshot_path) as catalog:
        assert titles(catalog.page(SDXL)) == ["old-pixel", "old-ink", "old-watercolor"]
        assert catalog.wait_idle(timeout=30)
        page = catalog.page(SDXL)
    assert titles(page) == ["old-pixel", "old-ink", "old-watercolor"]
    assert (page.freshness.source, page.freshness.offline) == ("snapshot", True)
    assert page.freshness.message.startswith("Offline: showing the snapshot of 2026-11-30 12:00 UTC")


def test_without_a_snapshot_the_first_call_waits_for_the_hub(clean_hub: StandInHub) -> None:
    with Catalog(HubSource(endpoint=clean_hub.url)) as catalog:
        page = catalog.page(SDXL)
    assert titles(page) == ["alpha-xl", "beta-xl", "gamma-xl"]
    assert page.freshness.source == "hub"


def test_without_a_snapshot_or_a_hub_the_list_is_empty_and_says_so() -> None:
    with Catalog(HubSource(endpoint=closed_port_url(), timeout_s=2.0)) as catalog:
        page = catalog.page(SDXL)
    assert page.entries == ()
    assert (page.freshness.source, page.freshness.offline, page.freshness.message) == (
        "none",
        True,
        "Offline: no snapshot",
    )


def test_corrupt_snapshot_starts_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{ this is not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="lora_catalog"):
        page = Catalog(None, snapshot_path=bad).page(SDXL)
    assert (page.entries, page.freshness.message) == ((), "Offline: no snapshot")
    assert "starting without a snapshot" in caplog.text and "is not valid JSON" in caplog.text


def test_hub_down_mid_session_keeps_the_last_good_list(clean_hub: StandInHub) -> None:
    clock = FakeClock()
    source = HubSource(endpoint=clean_hub.url, timeout_s=2.0)
    with Catalog(source, list_ttl_s=60.0, retry_after_s=30.0, clock=clock) as catalog:
        live = catalog.page(SDXL)
        assert titles(live) == ["alpha-xl", "beta-xl", "gamma-xl"]
        clean_hub.set_fault("down")
        clock.now += 61.0
        stale = catalog.page(SDXL)  # served at once while the background refresh fails
        assert titles(stale) == titles(live)
        assert catalog.wait_idle(timeout=30)
        kept = catalog.page(SDXL)
        assert titles(kept) == titles(live)
        assert (kept.freshness.source, kept.freshness.offline) == ("hub", True)
        assert kept.freshness.message.startswith("Offline: showing the Hub list of ")
        # While offline, a new search is answered from what is known, without asking the Hub again.
        asked = len(clean_hub.requests)
        searched = catalog.page(SDXL, search="beta")
        assert titles(searched) == ["beta-xl"] and searched.freshness.offline
        assert catalog.wait_idle(timeout=30) and len(clean_hub.requests) == asked
        # Back online: the next call after the retry interval refreshes in the background.
        clean_hub.set_fault(None)
        clock.now += 31.0
        catalog.page(SDXL)
        assert catalog.wait_idle(timeout=30)
        back = catalog.page(SDXL)
    assert (back.freshness.offline, back.freshness.message) == (False, "Live from the Hub, updated just now")


def test_lists_are_cached_per_base_search_and_sort(clean_hub: StandInHub) -> None:
    clock = FakeClock()
    with Catalog(HubSource(endpoint=clean_hub.url), list_ttl_s=60.0, clock=clock) as catalog:
        catalog.page(SDXL)
        clean_hub.clear_requests()
        catalog.page(SDXL, page=1, page_size=1)
        clock.now += 59.0
        catalog.page(SDXL)
        assert clean_hub.requests == []
        by_likes = catalog.page(SDXL, sort="likes")  # known online: a new key is fetched at once
        assert titles(by_likes) == ["beta-xl", "gamma-xl", "alpha-xl"]
        searched = catalog.page(SDXL, search="gam")
        assert titles(searched) == ["gamma-xl"]
        assert [r.query.get("search") for r in clean_hub.requests] == [None, ["gam"]]
        clock.now += 2.0  # the first list is now stale: served as is, refreshed behind
        catalog.page(SDXL)
        assert catalog.wait_idle(timeout=30)
    assert len(clean_hub.requests) == 3


def test_the_krea2_filter_lists_the_adapters_whose_card_names_each_base(clean_hub: StandInHub) -> None:
    """Krea 2 Turbo and Raw are both in the base filter; Raw lists the adapters whose card names
    `krea/Krea-2-Raw` (the Hub's `base_model:adapter:` filter), as Krea 2 LoRAs; Turbo its own."""
    assert {(b.repo_id, b.display_name) for b in KNOWN_BASES if b.family is Family.KREA2} == {
        (KREA2_TURBO, "Krea 2 Turbo"),
        (KREA2_RAW, "Krea 2 Raw"),
    }
    with Catalog(HubSource(endpoint=clean_hub.url)) as catalog:
        raw = catalog.page(KREA2_RAW)
        turbo = catalog.page(KREA2_TURBO)
    assert titles(raw) == ["ink-krea2", "grain-krea2"] and raw.freshness.source == "hub"
    assert all((e.family, e.base_models) == (Family.KREA2, (KREA2_RAW,)) for e in raw.entries)
    assert titles(turbo) == ["speed-krea2-turbo"] and turbo.entries[0].family is Family.KREA2
    assert [r.query["filter"] for r in clean_hub.requests] == [
        ["lora", f"base_model:adapter:{KREA2_RAW}"],
        ["lora", f"base_model:adapter:{KREA2_TURBO}"],
    ]


def test_save_snapshot_then_serve_it(clean_hub: StandInHub, tmp_path: Path) -> None:
    path = tmp_path / "out" / "sdxl.json"
    with Catalog(HubSource(endpoint=clean_hub.url), refresh=False) as catalog:
        saved = catalog.save_snapshot(path, SDXL)
    loaded = read_snapshot(path)
    assert loaded == saved
    assert [e.title for e in loaded.entries] == ["alpha-xl", "beta-xl", "gamma-xl"]
    assert all(e.sha and e.repo_id for e in loaded.entries)
    page = Catalog(None, snapshot_path=path).page(SDXL)
    assert titles(page) == ["alpha-xl", "beta-xl", "gamma-xl"]


def test_refresh_off_never_asks_the_hub_for_pages(clean_hub: StandInHub, snapshot_path: Path) -> None:
    with Catalog(HubSource(endpoint=clean_hub.url), snapshot_path=snapshot_path, refresh=False) as catalog:
        page = catalog.page(SDXL)
        assert catalog.wait_idle(timeout=5)
        assert page.freshness.offline and clean_hub.requests == []
        assert [e.title for e in catalog.refresh_now(SDXL)] == ["alpha-xl", "beta-xl", "gamma-xl"]
        live = catalog.page(SDXL)
    assert (live.freshness.source, live.freshness.offline) == ("hub", False)


def test_resolve_goes_through_the_hub(clean_hub: StandInHub) -> None:
    entry = Catalog(HubSource(endpoint=clean_hub.url), refresh=False).resolve(f" {NS}/beta-xl ")
    assert (entry.weight_name, entry.family) == ("x.safetensors", Family.SDXL)
    with pytest.raises(HubUnavailableError, match=r"cannot look up 'o/n': this catalogue runs without the Hub"):
        Catalog(None).resolve("o/n")
    with pytest.raises(HubUnavailableError, match=r"no Hub source"):
        Catalog(None).refresh_now(SDXL)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sort": "stars"}, r"sort 'stars' is not accepted; accepted: downloads, likes, trending, recent"),
        ({"page": -1}, r"page=-1 is not accepted"),
        ({"page_size": 0}, r"page_size=0 is not accepted; accepted: 1 to 200"),
    ],
)
def test_bad_page_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        Catalog(None).page(SDXL, **kwargs)  # type: ignore[arg-type]


def test_snapshot_file_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.json"
    with pytest.raises(SnapshotError, match=r"snapshot '.*s.json' does not exist"):
        read_snapshot(path)
    path.write_text('{"format": 2, "base": "a/b", "created_at": "2026-01-01T00:00:00+00:00", "entries": []}')
    with pytest.raises(SnapshotError, match=r"has format 2; accepted: format 1"):
        read_snapshot(path)
    path.write_text("[]")
    with pytest.raises(SnapshotError, match=r"holds a JSON list, not an object"):
        read_snapshot(path)
    path.write_text('{"format": 1, "base": "a/b", "created_at": "never", "entries": []}')
    with pytest.raises(SnapshotError, match=r"has created_at 'never'; accepted: an ISO 8601 time"):
        read_snapshot(path)
    good = snap_entry("kept").to_json()
    path.write_text(
        '{"format": 1, "base": "a/b", "created_at": "2026-01-01T00:00:00Z", "entries": [1, {"title": "x"}, '
        + json.dumps(good)
        + "]}"
    )
    with caplog.at_level(logging.WARNING, logger="lora_catalog"):
        loaded = read_snapshot(path)
    assert [e.title for e in loaded.entries] == ["kept"]
    assert "skipping entry 0" in caplog.text and "skipping entry 1" in caplog.text


def test_snapshot_is_written_atomically(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_snapshot(path, Snapshot.of(SDXL, SNAPSHOT_TIME, SNAPSHOT_ENTRIES))
    write_snapshot(path, Snapshot.of(SDXL, SNAPSHOT_TIME, SNAPSHOT_ENTRIES[:1]))
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temp file left behind
    assert read_snapshot(path).entries == SNAPSHOT_ENTRIES[:1]
