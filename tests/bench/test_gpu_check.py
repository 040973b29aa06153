"""bench/gpu_check.sh: its CPU dry run end to end, its time budget, and what its venv can leave out (gradio)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
# `step NAME LIMIT_S cuda|any ...` lines (hooks are commented out and not counted).
STEP = re.compile(r"^step (\S+) (\d+) (cuda|any) ", re.MULTILINE)
# What gpu_wheels.sh leaves out: gradio and what only it needs, and requirements-dev.txt's test-only tools.
NOT_CARRIED = ("gradio", "gradio_client", "fastapi", "uvicorn", "lycoris", "playwright", "simpy")
INSTALL = re.compile(r"timeout -k \d+ (\d+) ")


def test_its_limits_sum_to_under_nine_minutes():
    text = SCRIPT.read_text()
    steps = STEP.findall(text)
    install = sum(int(limit) for limit in INSTALL.findall(text.split("--- the steps")[0]))
    assert len(steps) >= 8 and install > 0
    assert install + sum(int(limit) for _, limit, _ in steps) <= 9 * 60


def test_the_cpu_dry_run_goes_end_to_end_with_every_cuda_step_skipped(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--cpu-dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = (out / "gpu_check.txt").read_text().splitlines()
    assert done.stdout.rstrip().endswith(results[-1])
    assert results[0].startswith("install: skipped (--cpu-dry-run")
    env_line = next(line.strip() for line in results if line.strip().startswith("env: gpu="))
    assert "gpu='none'" in env_line and "diffusers=" in env_line and "peft=" in env_line
    assert any(line.startswith("env: ok in ") for line in results), results
    steps = STEP.findall(SCRIPT.read_text())
    for name, _, needs in steps:
        if needs == "cuda":
            assert f"{name}: skipped (--cpu-dry-run)" in results
    assert [name for name, *_ in steps][:2] == ["env", "pytest_gpu"]
    assert (out / "gpu_check.log").is_file()


def test_the_gpu_tests_and_benchmarks_import_without_gradio_or_test_only_tools():
    """Regression: serving.backends.zerogpu imported gradio at module level, so the local backend (and through it
    bench.compile and the gpu tests) could not run in gpu_check.sh's venv, which carries no gradio (36 MiB more
    than the tree's 64 MiB limit leaves room for) nor the test-only tools."""
    gpu_tests = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in path.read_text()
    )
    benches = [
        "bench.swap",
        "bench.pools",
        "bench.pristine",
        "bench.compile",
        "bench.unet_step",
        "bench.cuda_confirm",
        "bench.wan_step",
        "bench.mixed",
        "bench.mixed_cpu",
    ]
    support = ["tests.conftest", "tests.support.standin_hub", "tests.support.loras"]
    modules = [*benches, *support, *gpu_tests]
    assert "tests.engine.pools.test_gpu" in modules
    blocker = (
        "import importlib, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] in {NOT_CARRIED!r}:\n"
        "            raise ImportError(f'{name} is not carried')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
