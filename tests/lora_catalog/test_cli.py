"""`python -m lora_catalog` in a subprocess, and the promise that importing the package pulls in no torch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save

from tests.support.standin_hub import StandInHub

REPO_ROOT = Path(__file__).resolve().parents[2]
SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
NS = "cat-cli"


def card() -> bytes:
    return f"---\n{yaml.safe_dump({'base_model': SDXL, 'tags': ['lora'], 'license': 'cc-by-nc-4.0'})}---\n".encode()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    weights = save({"lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": np.ones((2, 4), np.float32)})
    with StandInHub(tmp_path_factory.mktemp("catalog-cli-hub")) as started:
        for name, likes in (("one-xl", 1), ("two-xl", 5)):
            started.add_repo(f"{NS}/{name}", {"README.md": card(), "x.safetensors": weights}, likes=likes)
        yield started


def closed_port_url() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "lora_catalog", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_refresh_then_list_offline_from_the_snapshot(hub: StandInHub, tmp_path: Path) -> None:
    refreshed = run_cli(tmp_path, "refresh", "--base", SDXL, "--endpoint", hub.url)
    assert refreshed.returncode == 0, refreshed.stderr
    assert f"wrote 2 LoRAs for {SDXL} to snapshots/sdxl.json" in refreshed.stderr
    assert (tmp_path / "snapshots" / "sdxl.json").is_file()

    listed = run_cli(tmp_path, "list", "--json", "--sort", "likes", "--endpoint", closed_port_url(), "--timeout", "2")
    assert listed.returncode == 0, listed.stderr
    assert "the Hub is unreachable" in listed.stderr and "listing from the snapshot" in listed.stderr
    document = json.loads(listed.stdout)
    assert [e["ref"] for e in document["entries"]] == [f"{NS}/two-xl", f"{NS}/one-xl"]
    assert document["entries"][0]["non_commercial"] is True
    assert document["freshness"]["offline"] is True
    assert document["freshness"]["message"].startswith("Offline: showing the snapshot of ")


def test_list_live_as_a_table(hub: StandInHub, tmp_path: Path) -> None:
    listed = run_cli(tmp_path, "list", "--endpoint", hub.url, "--search", "two", "--limit", "5")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [f"{NS}/two-xl\t0\t5\tcc-by-nc-4.0 [non-commercial]\ttwo-xl"]


def test_refresh_to_a_named_file_for_another_base(hub: StandInHub, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere.json"
    refreshed = run_cli(tmp_path, "refresh", "--base", "someone/other-base", "--endpoint", hub.url, "--out", str(out))
    assert refreshed.returncode == 0, refreshed.stderr
    assert json.loads(out.read_text())["entries"] == []
    assert not (tmp_path / "snapshots").exists()


def test_errors_exit_non_zero_with_a_message(tmp_path: Path) -> None:
    bad_base = run_cli(tmp_path, "refresh", "--base", "../x", "--endpoint", closed_port_url())
    assert bad_base.returncode == 1
    assert "error: base model id '../x' is not accepted" in bad_base.stderr
    unreachable = run_cli(tmp_path, "refresh", "--endpoint", closed_port_url(), "--timeout", "2")
    assert unreachable.returncode == 1 and "could not be reached" in unreachable.stderr
    nothing = run_cli(tmp_path, "list", "--offline")
    assert nothing.returncode == 1 and "nothing to list: Offline: no snapshot" in nothing.stderr
    usage = run_cli(tmp_path, "list", "--sort", "stars")
    assert usage.returncode == 2 and "invalid choice: 'stars'" in usage.stderr


def test_importing_the_package_pulls_in_no_torch() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import lora_catalog; t = time.perf_counter() - t; "
        "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers', 'peft', 'safetensors', 'numpy') "
        "if m in sys.modules); print(f'{t:.3f}', ','.join(heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seconds, heavy = result.stdout.split(" ", 1)
    print(f"import lora_catalog took {seconds} s")
    assert heavy.strip() == ""


def test_default_snapshot_paths() -> None:
    from lora_catalog.snapshot import default_snapshot_path

    assert default_snapshot_path(SDXL) == Path("snapshots/sdxl.json")
    assert default_snapshot_path("RunDiffusion/Juggernaut-XL-v9") == Path(
        "snapshots/RunDiffusion__Juggernaut-XL-v9.json"
    )
