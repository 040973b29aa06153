"""bench.soak's ghost count on known times, and (slow) a short soak that ends with its line, every problem at 0, the
Gradio temp folder's size printed beside the peak RSS."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak import GRACE_S, HostWatch, ghost_runs
from bench.soak_clients import classify_title

REPO = Path(__file__).resolve().parents[2]
LAST = re.compile(
    r"soak: requests=(\d+) ok=(\d+) refused=(\d+) errors_5xx=(\d+) ghosts=(\d+) leaked_threads=(\d+) "
    r"disk_over_budget_bytes=(\d+) host_over_budget_bytes=(\d+) bad_images_accepted=(\d+) oversized_accepted=(\d+) "
    r"over_count_accepted=(\d+) peak_rss_over_idle_bytes=(\d+) gradio_tmp_bytes=(\d+) base_exact=(true|false)"
)


def test_a_ghost_is_a_run_that_started_well_after_its_client_left():
    departures = [[1, 100.0, "left"], [2, 100.0, "left"], [3, 100.0, "POST / hung up"]]
    admitted = [(1, 99.0), (2, 100.0 + GRACE_S / 2), (3, 100.0 + GRACE_S + 1), (4, 500.0)]
    assert ghost_runs(admitted, departures) == [
        f"seed 3 (POST / hung up) ran {GRACE_S + 1:.1f} s after its client left"
    ]


def test_errors_are_classified_by_the_status_their_title_carries():
    assert classify_title("Busy", "the engine is busy")[0] == "refused"
    assert classify_title("Hub unreachable", "down")[0] == "refused"
    assert classify_title("LoRA not found", "gone")[0] == "refused"
    assert classify_title("Generation failed", "boom")[0] == "errors_5xx"
    assert classify_title("Error", "an exception nobody mapped")[0] == "errors_5xx"


def test_host_over_budget_counts_all_pools_adapters_and_host_pristine_copies_against_host_ram_bytes():
    from types import SimpleNamespace

    from engine.settings import Settings

    settings = Settings(host_ram_bytes=10_000)

    def pool(host: int, pristine: int, on_device: int) -> SimpleNamespace:
        status = SimpleNamespace(host_bytes=host, host_budget=8_000, pristine_bytes=pristine)
        return SimpleNamespace(
            engine=SimpleNamespace(settings=settings, status=lambda: status, pristine_device_bytes=on_device)
        )

    # Each pool within HOST_CACHE_BYTES; together, with the first's pristine copies in host RAM, 2,500 over.
    watch = HostWatch(SimpleNamespace(pools=[pool(5_000, 1_500, 0), pool(6_000, 9_999, 1)]))
    watch.sample()
    assert watch.over == 2_500


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_soak_ends_with_every_problem_at_zero(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--duration-s",
            "60",
            "--warmup-s",
            "15",
            "--clients",
            "3",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    last = done.stdout.strip().splitlines()[-1]
    found = LAST.fullmatch(last)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    requests, ok, refused, errors, ghosts, leaked, disk, host, bad, oversized, counted, _, tmp, exact = found.groups()
    problems = (errors, ghosts, leaked, disk, host, bad, oversized, counted, exact)
    assert problems == ("0", "0", "0", "0", "0", "0", "0", "0", "true"), done.stdout[-3000:]
    # Something is in Gradio's temp folder at the end (the UI's example image at least): the figure is measured.
    assert int(tmp) > 0
    # The media pools were asked: videos answered (the warm-up sends some), an over-count edit refused.
    videos = re.search(r"soak: videos: (\d+) sent, (\d+) answered", done.stdout)
    assert videos and int(videos.group(2)) > 0, done.stdout[-3000:]
    assert re.search(r"soak: images: \d+ over_count through POST /", done.stdout), done.stdout[-3000:]
    assert int(ok) > 0 and int(refused) > 0 and int(requests) >= int(ok) + int(refused)
    assert done.returncode == 0
    assert json.loads(out.read_text())["base_exact"] is True


def test_base_exact_sees_a_branch_left_holding_a_lora_and_an_fp8_byte_changed():
    pytest.importorskip("torchao")
    from types import SimpleNamespace

    import torch

    from bench.soak_service import _branches_zero, _same_bytes, _weights
    from engine.weights.quantized import BranchedLinear

    branched = BranchedLinear(torch.nn.Linear(16, 8, bias=False), rank=4, dtype=torch.bfloat16)
    pipe = SimpleNamespace(components={"transformer": torch.nn.Sequential(branched)})
    loaded = _weights(pipe)
    assert _branches_zero(pipe)
    branched.load_branch([(torch.ones(2, 16), torch.ones(8, 2), 0.5)])
    assert not _branches_zero(pipe)
    branched.load_branch([])
    assert _branches_zero(pipe)
    assert all(_same_bytes(value, loaded[name]) for name, value in _weights(pipe).items())
    branched.weight.view(torch.uint8)[0, 0] ^= 1  # one fp8 value one bit off
    assert not _same_bytes(_weights(pipe)["transformer.0.weight"], loaded["transformer.0.weight"])
