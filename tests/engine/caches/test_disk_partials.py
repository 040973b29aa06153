"""Half-written downloads in the LoRA disk cache: stale ones are deleted by the prune, live ones are kept and
counted, and no stored Civitai file can be named like one."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.caches.disk import DiskCache
from engine.prepare.civitai import CivitaiFiles
from lora_catalog.civitai.download import PARTIAL_PREFIX, stale_partial_after_s
from lora_catalog.civitai.source import CivitaiSource
from tests.support.standin_civitai import StandInCivitai

TIMEOUT_S = 5.0


def _write(path: Path, size: int, *, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def _cache(folder: Path, budget: int) -> DiskCache:
    return DiskCache(budget, cache_dir=folder / "no-hub-cache", civitai_dir=folder, download_timeout_s=TIMEOUT_S)


def test_a_stale_partial_file_is_deleted_and_the_lora_it_crowded_out_is_kept(tmp_path):
    lora = _write(tmp_path / "11" / "style.safetensors", 1_000, age_s=3_600)
    partial = _write(tmp_path / "12" / f"{PARTIAL_PREFIX}abc123", 5_000, age_s=stale_partial_after_s(TIMEOUT_S) + 1)
    report = _cache(tmp_path, 3_000).prune()
    assert not partial.exists() and not partial.parent.exists()
    assert lora.exists() and report.deleted == ()
    assert report.after == 1_000 <= 3_000


def test_a_partial_file_being_written_is_kept_and_counted(tmp_path):
    lora = _write(tmp_path / "11" / "style.safetensors", 1_000, age_s=3_600)
    live = _write(tmp_path / "12" / f"{PARTIAL_PREFIX}live", 2_500, age_s=1)
    cache = _cache(tmp_path, 3_000)
    assert cache.lora_bytes() == 3_500
    report = cache.prune()
    # Over budget with the download's bytes: the LoRA goes, the download in progress stays.
    assert live.exists() and not lora.exists() and report.deleted == ("civitai:11",)


def test_a_version_folder_of_stale_partial_files_only_goes_with_them(tmp_path):
    held = _write(tmp_path / "21" / "style.safetensors", 100)
    stale = _write(tmp_path / "21" / f"{PARTIAL_PREFIX}old", 100, age_s=stale_partial_after_s(TIMEOUT_S) + 1)
    cache = _cache(tmp_path, 10_000)
    cache.prune()
    assert held.exists() and not stale.exists() and cache.lora_bytes() == 100


def test_stale_means_older_than_a_download_could_go_without_writing():
    # Each piece is written as it arrives, and a read waiting longer than the timeout fails the download.
    assert stale_partial_after_s(5.0) > 5.0 and stale_partial_after_s(120.0) > 120.0


@pytest.fixture(scope="module")
def civitai() -> Iterator[StandInCivitai]:
    with StandInCivitai() as started:
        started.add_lora(31, b"bytes of a LoRA" * 40, name=f"{PARTIAL_PREFIX}x.safetensors")
        started.add_lora(32, b"bytes of another" * 40, name=".hidden.safetensors")
        yield started


@pytest.mark.parametrize("version", [31, 32])
def test_a_civitai_file_named_like_a_partial_or_hidden_one_is_stored_under_a_plain_name(civitai, tmp_path, version):
    source = CivitaiSource(civitai.url, timeout_s=TIMEOUT_S, allowed_hosts=(civitai.storage_host,))
    try:
        files = CivitaiFiles(source, tmp_path, max_bytes=2**20)
        key, location, _ = files.locate(f"civitai:{version}")
        assert key.weight_name == "lora.safetensors"
        path = files.fetch(key, location)
        assert path == tmp_path / str(version) / "lora.safetensors" and path.is_file()
        # The cache sees a finished LoRA there, which it can delete, not a download in progress.
        assert _cache(tmp_path, 0).prune().deleted == (f"civitai:{version}",)
    finally:
        source.close()
