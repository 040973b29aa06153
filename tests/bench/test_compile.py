"""The compile benchmark: its summary line, and (slow) a short run of it end to end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compile import _line

ROOT = Path(__file__).resolve().parents[2]
LAST_LINE = re.compile(
    r"^compile: family=(\S+) mode=(\S+) recompiles_after_swaps=(\d+) max_diff_vs_eager=(\S+) "
    r"step_speedup=(\d+\.\d+) compile_s=(\d+\.\d)$"
)


def test_the_last_line_sums_recompiles_and_keeps_the_worst_of_the_rest():
    rows = [
        {
            "family": "sdxl",
            "mode": "default",
            "recompiles_after_swaps": 0,
            "max_diff_vs_eager": 1,
            "step_speedup": 1.3,
            "compile_s": 20.0,
        },
        {
            "family": "sd15",
            "mode": "default",
            "recompiles_after_swaps": 2,
            "max_diff_vs_eager": 0,
            "step_speedup": 1.1,
            "compile_s": 5.5,
        },
    ]
    line = _line(rows)
    assert line == (
        "compile: family=sdxl,sd15 mode=default recompiles_after_swaps=2 max_diff_vs_eager=1 step_speedup=1.10 "
        "compile_s=25.5"
    )
    assert LAST_LINE.match(line)


@pytest.mark.slow
def test_a_short_run_compiles_once_and_matches_eager(tmp_path):
    command = [sys.executable, "-m", "bench.compile", "--families", "sdxl", "--swaps", "5", "--repeats", "1"]
    command += ["--no-slice", "--cache-dir", str(tmp_path / "inductor")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=True)
    match = LAST_LINE.match(done.stdout.strip().splitlines()[-1])
    assert match is not None, done.stdout
    assert match.group(1) == "sdxl" and match.group(3) == "0"
    assert float(match.group(4)) <= 2
