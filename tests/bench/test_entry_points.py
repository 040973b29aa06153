"""(slow) Every `python -m bench.…` the README quotes, run end to end at its smallest size: each must end with its
result line, whose fields are read here. Covered elsewhere: bench.swap --quick (test_smoke), bench.compile
(test_compile), bench.serve (test_serve), bench.soak (test_soak), bench.fleet and bench.plots (in process, in
test_fleet and test_plots). Not here: bench.cluster and bench.fleet --real, which start a Ray cluster."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"(\d+(?:\.\d+)?(?:e[+-]\d+)?)"
# bench.swap's verdict line, with the traced conversion over the converter alone (`convert_trace_vs_plain`).
SWAP_LINE = rf"swap_vs_floor={NUMBER} swap_vs_reference={NUMBER} exact=(true|false) convert_trace_vs_plain={NUMBER}"

pytestmark = pytest.mark.slow


def last_line(*argv: str, timeout: int = 1500) -> str:
    """Run `python -m bench.<argv>` and return its last line, failing with its output if it failed."""
    done = subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(600)
def test_pristine_restores_a_share_of_sdxls_projections_from_host_ram():
    line = last_line("bench.pristine", "--device", "cpu", "--fraction", "0.02", "--repeats", "1")
    found = re.fullmatch(
        rf"pristine_restore_host_ms={NUMBER} device_ms=n/a host_vs_device=n/a bytes=(\d+) "
        rf"branch_restore_ms={NUMBER} branch_zero=(true|false)",
        line,
    )
    assert found, line
    assert float(found[1]) > 0 and int(found[2]) > 0 and float(found[3]) > 0 and found[4] == "true"


@pytest.mark.timeout(600)
def test_fp8_reports_the_worst_error_of_each_storage():
    line = last_line("bench.fp8", "--rank", "4")
    found = re.fullmatch(rf"worst_error_fp16={NUMBER} worst_error_bf16={NUMBER} worst_error_fp8_e4m3={NUMBER}", line)
    assert found, line
    assert all(float(value) >= 0 for value in found.groups())


@pytest.mark.timeout(1800)
def test_pools_brings_the_sd15_unet_back_exactly():
    line = last_line("bench.pools", "--models", "sd15", "--repeats", "1")
    found = re.fullmatch(rf"restore_vs_floor={NUMBER} exact=(true|false)", line)
    assert found, line
    assert float(found[1]) > 0 and found[2] == "true"


@pytest.mark.timeout(1800)
def test_preview_times_both_previews_against_a_full_size_step():
    line = last_line("bench.preview", "--side", "256", "--repeats", "1", "--step-repeats", "1")
    found = re.fullmatch(rf"linear_vs_step={NUMBER} taesd_vs_step={NUMBER}", line)
    assert found, line
    assert 0 < float(found[1]) < float(found[2])


@pytest.mark.timeout(1800)
def test_swap_on_the_flux_slice_ends_with_the_verdict_line():
    line = last_line("bench.swap", "--family", "flux", "--quick")
    assert (found := re.fullmatch(SWAP_LINE, line)), line
    assert float(found[1]) > 0 and float(found[2]) > 0 and found[3] == "true" and float(found[4]) > 0


@pytest.mark.timeout(2400)
def test_swap_on_the_qwen_image_slice_ends_with_the_verdict_line():
    line = last_line("bench.swap", "--family", "qwen", "--quick", timeout=2300)
    assert (found := re.fullmatch(SWAP_LINE, line)), line
    assert float(found[1]) > 0 and float(found[2]) > 0 and found[3] == "true" and float(found[4]) > 0


@pytest.mark.timeout(2400)
@pytest.mark.parametrize(
    ("options", "family", "storage"),
    [
        pytest.param((), "flux", "fp8", id="flux-by-default"),
        pytest.param(("--family", "wan"), "wan", "fp8", id="wan"),
        pytest.param(("--family", "krea2", "--storage", "int4"), "krea2", "int4", id="krea2-int4"),
    ],
)
def test_quantized_on_a_slice_ends_with_its_verdict_line(options, family, storage):
    quick = ("--quick", "--tokens", "64", "--repeats", "1", "--max-rank", "16")
    line = last_line("bench.quantized", *options, *quick, timeout=2300)
    found = re.fullmatch(
        rf"quantized: family={family} storage={storage} swap_ms={NUMBER} swap_vs_fused={NUMBER} "
        rf"step_vs_bf16_fused={NUMBER} step_vs_diffusers=(\S+) branch_rel_err={NUMBER} fused_fp8_rel_err={NUMBER} "
        rf"exact=(true|false)",
        line,
    )
    assert found, line
    assert all(float(found[i]) > 0 for i in (1, 2, 3, 5, 6)) and found[7] == "true"
    assert found[4] == "refused" or float(found[4]) > 0


@pytest.mark.timeout(600)
def test_quantized_refuses_gguf_on_the_wan_slice():
    done = subprocess.run(
        [sys.executable, "-m", "bench.quantized", "--family", "wan", "--storage", "gguf-q8_0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2 and "accepted with --family wan: fp8, int4" in done.stderr, done.stderr[-1000:]


@pytest.mark.timeout(600)
def test_wan_step_runs_the_tiny_wan_step_and_decode_with_both_lines():
    done = subprocess.run(
        [sys.executable, "-m", "bench.wan_step", "--tiny", "--device", "cpu", "--repeats", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    step, decode = done.stdout.strip().splitlines()[-2:]
    assert re.fullmatch(
        rf"wan_step: size=5x64x48 tokens=24 bf16_step_ms={NUMBER} fp8_step_ms={NUMBER} fp8_vs_bf16={NUMBER} "
        rf"step_peak_gib=na fp8_step_peak_gib=na planned_step_gib={NUMBER}",
        step,
    ), step
    assert re.fullmatch(
        rf"wan_decode: size=5x64x48 decode_ms={NUMBER} decode_peak_gib=na planned_decode_gib={NUMBER}", decode
    )


@pytest.mark.timeout(1800)
def test_unet_step_compiles_the_tiny_unet_and_matches_eager():
    line = last_line("bench.unet_step", "--tiny", "--side", "64", "--repeats", "1")
    found = re.fullmatch(
        rf"unet_step: mode=default eager_ms={NUMBER} compiled_ms={NUMBER} speedup={NUMBER} max_diff={NUMBER} "
        rf"compile_s={NUMBER}",
        line,
    )
    assert found, line
    eager, compiled, speedup, diff, compile_s = (float(value) for value in found.groups())
    assert eager > 0 and compiled > 0 and speedup > 0 and compile_s > 0
    # float32 on the CPU: compiled kernels reorder sums, a difference of a few ulps of the output's range.
    assert diff < 1e-4


@pytest.mark.timeout(600)
def test_cuda_confirm_registers_a_pool_in_place_and_measures_a_decode_on_the_tiny_configs():
    """On the CPU (--tiny) without the allocator's figures; on a GPU bench/gpu_check.sh runs them full size."""
    line = last_line("bench.cuda_confirm", "residency", "--tiny", "--device", "cpu")
    found = re.fullmatch(rf"residency: moves_on_add=(\d+) extra_on_add_vs_weights=na move_in_s={NUMBER} .*", line)
    assert found, line
    assert found[1] == "0"
    line = last_line("bench.cuda_confirm", "vae_decode", "--tiny", "--device", "cpu")
    expected = rf"vae_decode: side=128 step_extra_gib=na decode_extra_gib=na working_gib={NUMBER} fits=na"
    assert re.fullmatch(expected, line), line
    line = last_line("bench.cuda_confirm", "wan_video", "--tiny", "--device", "cpu")
    expected = rf"wan_video: size=5x64x48 tokens=24 step_extra_gib=na step_planned_gib={NUMBER} .* fits=na"
    assert re.fullmatch(expected, line), line
    for measure in ("host_pinned", "rerecord"):
        done = subprocess.run(
            [sys.executable, "-m", "bench.cuda_confirm", measure, "--tiny", "--device", "cpu"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "accepted: a CUDA device" in done.stderr, done.stderr[-1000:]


@pytest.mark.timeout(1500)
def test_mixed_compares_the_whole_run_lock_with_step_sharing_on_both_devices():
    line = last_line("bench.mixed", "--quick", "--device", "cpu")
    found = re.fullmatch(
        rf"mixed: image_p95_vs_alone={NUMBER} image_wait_max_vs_video_step={NUMBER} video_p95_vs_whole_run={NUMBER} "
        rf"device_busy={NUMBER} exact=(true|false) whole_run_image_p95_vs_alone={NUMBER} sim_gap={NUMBER}",
        line,
    )
    assert found, line
    # Timing goals are the bench's (docs/benchmarks.md); here: sharing beats the lock for images, and is exact.
    assert float(found[1]) < float(found[6]) and float(found[4]) > 0 and found[5] == "true"
