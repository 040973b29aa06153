#!/usr/bin/env bash
# The prepared GPU check: every GPU measurement, most valuable first, in one run that fits a lent machine's minutes.
#
#   bash bench/gpu_wheels.sh              # here, once: the wheels into .whl/ (the GPU machine cannot fetch)
#   bash bench/gpu_check.sh               # there, from the repository root (carry .whl)
#   bash bench/gpu_check.sh --cpu-dry-run # anywhere: the same run with this Python, each CUDA step skipped
#
# It makes a venv that sees the machine's own torch (--system-site-packages) and installs the carried wheels into
# it, then runs each step under its own `timeout`; the limits sum to under 9 minutes on an H100/H200-class
# machine. Every step's result lines (and a status line: ok, failed, timed out or skipped) go to
# $OUT/gpu_check.txt (OUT defaults to ./gpu_check_out), its whole output to $OUT/gpu_check.log, and the results
# are printed at the end. A step that fails or runs out of time does not stop the ones after it. Without a CUDA
# device each CUDA step is skipped with a line saying so. To add a measurement: one `step` line below.
set -uo pipefail

dry=0
for arg in "$@"; do
  case "$arg" in
    --cpu-dry-run) dry=1 ;;
    *) echo "unknown argument $arg; accepted: --cpu-dry-run" >&2; exit 2 ;;
  esac
done

OUT="${OUT:-./gpu_check_out}"
mkdir -p "$OUT"
results="$OUT/gpu_check.txt"
log="$OUT/gpu_check.log"
: >"$results"
: >"$log"
began=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Nothing to fetch there: every model is built from a config with random weights, every LoRA written locally.
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False TOKENIZERS_PARALLELISM=false

say() { echo "$*" | tee -a "$results"; }

# --- the venv -------------------------------------------------------------------------------------------------
if [ "$dry" = 1 ]; then
  py="${PYTHON:-python3}"
  say "install: skipped (--cpu-dry-run: $py as it is)"
else
  venv="${GPU_CHECK_VENV:-/tmp/gpu_check_venv}"
  started=$(date +%s)
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    say "install: failed (no wheels in .whl/: run bash bench/gpu_wheels.sh here first and carry .whl)"
    exit 1
  fi
  # The machine's python3 is itself a venv's (/opt/torch/.venv): --system-site-packages would reach only its base
  # interpreter's packages, so the new venv also reads that venv's site-packages through a .pth file, after its
  # own (a carried wheel wins over the machine's copy). Installed with the machine's pip, by target folder.
  if timeout -k 5 20 python3 -m venv --system-site-packages --without-pip "$venv" >>"$log" 2>&1 &&
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") &&
    python3 -c "import site; print('\n'.join(site.getsitepackages()))" >"$site/_machine_packages.pth" &&
    timeout -k 5 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" .whl/*.whl >>"$log" 2>&1; then
    say "install: ok ($(ls .whl/*.whl | wc -l) wheels in $(($(date +%s) - started)) s)"
  else
    say "install: failed (see $log)"
    exit 1
  fi
  py="$venv/bin/python"
fi

cuda=0
if [ "$dry" = 0 ]; then
  cuda=$("$py" -c "import torch; print(int(torch.cuda.is_available()))" 2>>"$log" || echo 0)
fi

# step NAME LIMIT_S cuda|any PATTERN COMMAND...: run COMMAND under `timeout LIMIT_S`; its lines matching the
# extended regex PATTERN are its results.
step() {
  local name=$1 limit=$2 needs=$3 pattern=$4
  shift 4
  # The limits are the lent GPU machine's budget (16 cores). A dry run checks the script's flow on a 2-core CPU
  # host, which may be busy (CI beside other work took over 30 s to import torch and diffusers): it waits 6x.
  [ "$dry" = 1 ] && limit=$((limit * 6))
  if [ "$needs" = cuda ] && [ "$cuda" != 1 ]; then
    say "$name: skipped ($([ "$dry" = 1 ] && echo "--cpu-dry-run" || echo "no CUDA device"))"
    return
  fi
  local started rc took status
  started=$(date +%s)
  printf '\n===== %s (limit %s s): %s\n' "$name" "$limit" "$*" >>"$log"
  local output="$OUT/.step.out"
  timeout -k 10 "$limit" "$@" >"$output" 2>&1
  rc=$?
  took=$(($(date +%s) - started))
  cat "$output" >>"$log"
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out after $limit s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  say "$name: $status in $took s"
  grep -E -- "$pattern" "$output" | sed "s/^/  /" | tee -a "$results"
  rm -f "$output"
}

# --- the steps, most valuable first (limits sum to 490 s; with the install's 50, 540 s) -------------------
step env 20 any '^env:' "$py" -c "
import torch, diffusers, peft, transformers, huggingface_hub, safetensors
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'
print(f'env: gpu={gpu!r} torch={torch.__version__} cuda={torch.version.cuda} diffusers={diffusers.__version__} '
      f'peft={peft.__version__} transformers={transformers.__version__} huggingface_hub={huggingface_hub.__version__}')"
# pytest -m gpu over the files that hold gpu tests (the others import test-only tools the venv does not carry).
gpu_tests=$(grep -rlE 'pytest\.mark\.gpu' tests --include='test_*.py' | sort | tr '\n' ' ')
# -v: each test's verdict is printed as it ends, so a run cut short by its limit still reports those that ran.
step pytest_gpu 55 cuda ' (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)|^(FAILED|ERROR) |[0-9]+ (passed|failed)' \
  "$py" -m pytest -p no:cacheprovider -v -rfEs -m gpu --timeout 55 $gpu_tests
# Issue 29's section 4, confirmed: a pool added on cuda is not copied again; pinned at its size; a step's and a
# float32 VAE decode's working memory against the plan's reserve; moving a compiled pool with and without graphs.
step residency 25 cuda '^residency: ' "$py" -m bench.cuda_confirm residency
step host_pinned 20 cuda '^host_pinned: ' "$py" -m bench.cuda_confirm host_pinned
step vae_decode 25 cuda '^vae_decode: ' "$py" -m bench.cuda_confirm vae_decode
step rerecord 25 cuda '^rerecord: ' "$py" -m bench.cuda_confirm rerecord --tiny --moves 20
# bench.swap on CUDA also runs variant (g): the pristine copies in pinned host memory, as the A10G plan keeps SDXL's.
step swap_sdxl 35 cuda '^(swap_vs_floor=|swap benchmark:)|\(g\) ' "$py" -m bench.swap --device cuda --quick
step swap_flux 25 cuda '^(swap_vs_floor=|swap benchmark:)' "$py" -m bench.swap --device cuda --quick --family flux
step pools 25 cuda '^(restore_vs_floor=|gpu:)' "$py" -m bench.pools --device cuda --dtype float16 --repeats 2
step pristine 15 cuda '^pristine_restore' "$py" -m bench.pristine --device cuda
step compile_tiny 30 cuda '^compile: ' \
  "$py" -m bench.compile --device cuda --tiny --families sdxl --swaps 6 --repeats 3 --steps 4
step unet_step 20 cuda '^unet_step: ' "$py" -m bench.unet_step --device cuda --modes default --repeats 3
# A host-RAM T5's encode: on the host's CPU, streamed to the GPU (group offloading), and from the prompt cache.
step encode 20 cuda '^encode_host_s=' "$py" -m bench.encode --layers 1 --repeats 2
# Each reference image's cost in Qwen-Image-Edit-2509/2511's prompt encoding (Qwen2.5-VL-7B's widths, 2 of its 28
# layers and 2 of its 32 vision blocks, scaled); residency, rerecord, swap_flux and pools gave it 5 s each.
step encode_references 20 cuda '^reference_encode: ' "$py" -m bench.encode --references --repeats 2
# Issue 43: a GGUF Q4_K and an int4 step (FLUX.1 slice, 4096 image tokens, rank-64 LoRA as a branch) with its peak
# memory above the weights, against bf16 fused; 40 s together (env gave 30 s of its 60, swap_sdxl 10 of its 55).
step quantized_q4_k 22 cuda '^quantized_cuda: ' "$py" -m bench.quantized_cuda --storage gguf-q4_k --repeats 3
step quantized_int4 18 cuda '^quantized_cuda: ' "$py" -m bench.quantized_cuda --storage int4 --repeats 3
# Issue 42: one 14B Wan block's step at 81 x 832 x 480 in bf16 and in fp8 with a rank-64 LoRA as branches, and
# Wan 2.1's VAE decoding those 81 frames, each with its peak memory against the plan's (random weights); the step's
# line is printed before the decode runs. 20 s: pytest_gpu gave 10 of its 65, swap_flux 10 of its 40.
step wan_step 20 cuda '^wan_(step|decode): ' "$py" -m bench.wan_step --repeats 2
# Issue 50: LTX-2 19B's swap on its real-width slice (2 audio-video blocks, 1.12 B parameters), against the floor.
# 25 s: residency, vae_decode and rerecord gave 5 s each, unet_step 10 (none has run on a GPU yet: guesses alike).
step swap_ltx2 25 cuda '^(swap_vs_floor=|swap benchmark:)' "$py" -m bench.swap --device cuda --quick --family ltx2
# Issue 48: bench.mixed's engine replay on CUDA: the tiny SDXL and Wan pools behind the real engine with the
# whole-run lock and with step sharing, real step times; `exact` and the image/video ratios (the stand-in A10G's
# replays are quick; the fleet model needs simpy, not carried: skipped in a line). The smallest run, one video per
# mode. 45 s, none of it measured yet: env gave 10 of its 30, swap_sdxl and compile_tiny 10 each, swap_flux, pools
# and unet_step 5 each (the budget had no second left).
step mixed 45 cuda '^(mixed:|cpu_|cuda_)' "$py" -m bench.mixed --quick --device cuda --cpu-videos 1
# Worth adding when a lent machine has minutes left (not in the 9-minute budget):
# step unet_step_graphs 90 cuda '^unet_step: ' "$py" -m bench.unet_step --device cuda --modes reduce-overhead

echo
echo "gpu_check: $(($(date +%s) - began)) s in all; results in $results, output in $log"
cat "$results"
