"""Local LoRA folders: entries from safetensors headers only, merged into catalogue pages."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from lora_catalog import (
    Catalog,
    Family,
    InvalidRepoIdError,
    InvalidRequestError,
    LoraEntry,
    LoraNotFoundError,
    Snapshot,
    scan_local_dirs,
    write_snapshot,
)

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
KOHYA_XL = "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"
PEFT_XL = "text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight"
KOHYA_SD15 = "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"
FLUX_KEY = "transformer.single_transformer_blocks.0.attn.to_k.lora_A.weight"


def write(path: Path, names: list[str], metadata: dict[str, str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({n: np.ones((2, 4), np.float32) for n in names}, str(path), metadata=metadata)
    return path


@pytest.fixture
def lora_dir(tmp_path: Path) -> Path:
    root = tmp_path / "loras"
    write(
        root / "styles" / "pixel.safetensors",
        [KOHYA_XL],
        {
            "ss_base_model_version": "sdxl_base_v1-0",
            "ss_output_name": "pixel_v2",
            "modelspec.title": "Pixel Style",
            "modelspec.trigger_phrase": "pxl",
            "modelspec.license": "cc-by-nc-4.0",
            "modelspec.tags": "pixel, retro",
        },
    )
    (root / "styles" / "pixel.png").write_bytes(b"png")
    write(root / "water.safetensors", [PEFT_XL])
    (root / "water.preview.webp").write_bytes(b"webp")
    write(root / "kohya_named.safetensors", [KOHYA_XL], {"ss_output_name": "Ink Wash", "instance_prompt": "ink"})
    write(root / "old" / "sd15.safetensors", [KOHYA_SD15])
    write(root / "flux.safetensors", [FLUX_KEY], {"modelspec.architecture": "flux-1-dev/lora"})
    write(root / "checkpoint.safetensors", ["model.diffusion_model.input_blocks.0.0.weight"])
    (root / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    write(root / ".cache" / "partial.safetensors", [KOHYA_XL])
    (root / "notes.txt").write_text("not a LoRA")
    return root


def test_scan_reads_headers_into_entries(lora_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lora_catalog"):
        index = scan_local_dirs([lora_dir])
    assert sorted(index.by_ref) == [
        "local:flux.safetensors",
        "local:kohya_named.safetensors",
        "local:old/sd15.safetensors",
        "local:styles/pixel.safetensors",
        "local:water.safetensors",
    ]
    pixel = index.by_ref["local:styles/pixel.safetensors"].entry
    assert (pixel.title, pixel.family, pixel.trigger_words) == ("Pixel Style", Family.SDXL, ("pxl",))
    assert (pixel.license, pixel.non_commercial, pixel.tags) == ("cc-by-nc-4.0", True, ("pixel", "retro"))
    assert pixel.preview_urls == (str(lora_dir / "styles" / "pixel.png"),)
    assert (pixel.source, pixel.repo_id, pixel.weight_name) == ("local", None, "pixel.safetensors")
    assert pixel.weight_size == (lora_dir / "styles" / "pixel.safetensors").stat().st_size
    water = index.by_ref["local:water.safetensors"].entry
    assert (water.title, water.family, water.preview_urls) == (
        "water",
        Family.SDXL,
        (str(lora_dir / "water.preview.webp"),),
    )
    named = index.by_ref["local:kohya_named.safetensors"].entry
    assert (named.title, named.trigger_words, named.preview_urls) == ("Ink Wash", ("ink",), ())
    assert index.by_ref["local:old/sd15.safetensors"].entry.family is Family.SD15
    assert index.by_ref["local:flux.safetensors"].entry.family is Family.FLUX
    assert "broken.safetensors" in caplog.text and "header is not JSON" in caplog.text
    assert "checkpoint.safetensors: its tensors are not a LoRA's" in caplog.text


def test_missing_folder_is_skipped_with_a_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lora_catalog"):
        assert scan_local_dirs([tmp_path / "nowhere"]).entries == ()
    assert "does not exist" in caplog.text


def test_local_entries_come_first_and_only_for_the_served_family(lora_dir: Path, tmp_path: Path) -> None:
    snapshot = tmp_path / "snap.json"
    hub_entry = LoraEntry(ref="o/hub-xl", repo_id="o/hub-xl", title="hub-xl", family=Family.SDXL, downloads=9)
    write_snapshot(snapshot, Snapshot.of(SDXL, datetime(2026, 1, 1, tzinfo=UTC), [hub_entry]))
    page = Catalog(None, snapshot_path=snapshot, local_dirs=[lora_dir]).page(SDXL)
    assert [e.title for e in page.entries] == ["Ink Wash", "Pixel Style", "water", "hub-xl"]
    assert page.freshness.source == "snapshot"
    assert [e.title for e in Catalog(None, local_dirs=[lora_dir]).page(SD15).entries] == ["sd15"]
    searched = Catalog(None, local_dirs=[lora_dir]).page(SDXL, search="retro")
    assert [e.title for e in searched.entries] == ["Pixel Style"]
    assert searched.freshness.source == "local"
    assert searched.freshness.message == "Offline: no snapshot; showing local LoRAs only"


def test_resolve_local_refs(lora_dir: Path) -> None:
    catalog = Catalog(None, local_dirs=[lora_dir])
    entry = catalog.resolve("local:styles/pixel.safetensors")
    assert entry.title == "Pixel Style"
    assert catalog.local_lora("local:styles/pixel.safetensors").path == lora_dir / "styles" / "pixel.safetensors"
    with pytest.raises(InvalidRepoIdError, match=r"local ref 'local:\.\./etc/x.safetensors' is not accepted"):
        catalog.resolve("local:../etc/x.safetensors")
    with pytest.raises(InvalidRepoIdError, match=r"local ref 'local:/etc/x.safetensors' is not accepted"):
        catalog.resolve("local:/etc/x.safetensors")
    with pytest.raises(LoraNotFoundError, match=r"local LoRA 'local:nope.safetensors' was not found in the local"):
        catalog.resolve("local:nope.safetensors")
    with pytest.raises(LoraNotFoundError, match=r"'local:checkpoint.safetensors' was not found"):
        catalog.resolve("local:checkpoint.safetensors")
    with pytest.raises(InvalidRequestError, match=r"takes no revision or weight_name"):
        catalog.resolve("local:water.safetensors", revision="main")


def test_rescan_picks_up_new_files(lora_dir: Path) -> None:
    catalog = Catalog(None, local_dirs=[lora_dir])
    before = len(catalog.page(SDXL).entries)
    write(lora_dir / "new.safetensors", [KOHYA_XL], {"ss_base_model_version": "sdxl_v1"})
    assert catalog.rescan_local() == 6
    assert len(catalog.page(SDXL).entries) == before + 1
