#!/usr/bin/env bash
# Download, here, the wheels bench/gpu_check.sh installs on a lent GPU machine (which cannot fetch), into .whl/
# (git-ignored; it travels with the tree, whose limit is 64 MiB: this prints the total).
#
# The lent machine has Python 3.12 with torch and CUDA and many common packages already (numpy, pillow, pandas,
# pytest, jinja2, httpx, tokenizers, ...: /work/.library/device/KINDS.md's list). Carried: requirements.txt's pins
# except torch (the machine's own CUDA build is used), the packages they need that the machine lacks, at the
# versions the project's venv resolved them to, and the test runner at requirements-dev.txt's pins. `--no-deps`:
# each wheel is named once. tokenizers is the machine's own (0.23.2; transformers asks for >=0.23.1,<0.24).
# gradio and what only the UI needs (36 MiB, over the limit beside the rest) are left out unless `--ui`: the GPU
# measurements and the gpu tests do not import gradio.
#
#   bash bench/gpu_wheels.sh [--ui] [--python PYTHON]     # run from the repository root
set -euo pipefail

python=python3
ui=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ui) ui=1 ;;
    --python) python="$2"; shift ;;
    *) echo "unknown argument $1; accepted: --ui, --python PYTHON" >&2; exit 2 ;;
  esac
  shift
done

# requirements.txt's pins but torch (and, unless --ui, gradio's two), and the test runner's from requirements-dev.txt.
pinned=$(grep -E '^[A-Za-z0-9_.-]+==' requirements.txt | grep -vE '^torch==')
if [ "$ui" = 0 ]; then pinned=$(echo "$pinned" | grep -vE '^gradio(_client|-client)?=='); fi
dev=$(grep -E '^(pytest|pytest-timeout|pytest-xdist)==' requirements-dev.txt)
# What those need that the machine lacks (or has too old), at the versions the project's venv resolved.
needed=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 httpcore2==2.16.2
  importlib-metadata==10.2.0 lazy-importer==0.1.0 truststore==0.10.5
)
# What gradio needs beyond the machine's packages (--ui only).
ui_needed=(
  hf-gradio==0.4.1 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 groovy==0.1.2 orjson==3.13.0 brotli==1.2.1
  pydub==0.25.1 python-multipart==0.0.34 safehttpx==0.1.7 semantic-version==2.10.0 tomlkit==0.14.0
  opentelemetry-api==1.45.2 pytz==2026.6 tzdata==2026.6
)
# shellcheck disable=SC2206  # one pin a word
wanted=($pinned $dev "${needed[@]}")
if [ "$ui" = 1 ]; then wanted+=("${ui_needed[@]}"); fi

rm -rf .whl && mkdir -p .whl
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl "${wanted[@]}"
count=$(find .whl -type f -name '*.whl' | wc -l)
echo "gpu_wheels: $count wheels, $(du -sm .whl | cut -f1) MiB in .whl/ (the tree travels with a 64 MiB limit)"
