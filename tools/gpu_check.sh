#!/usr/bin/env bash
# The prepared check of the `cuda` backend on a machine with an NVIDIA GPU (issue #35):
# installs nothing from the network, builds random models, runs the op witness, the
# exactness and sync checks on the device and a short benchmark against torch's eager path,
# within five minutes, and writes JSON to $OUT (default ./gpu_check_out).
#
# The GPU machine has its own Python with torch, Triton, transformers, safetensors, numpy;
# agentkv's other pure-Python needs travel as wheels in .whl/ (git-ignored), fetched here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl gguf jinja2 markupsafe pyyaml tqdm psutil
# (see /work/shared/MEASUREMENTS.md for what that machine lacks).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/agentkv-site .whl/*.whl
  export PYTHONPATH="/tmp/agentkv-site:$PWD"
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" >"$OUT/nvidia-smi.txt"
export PYTHONUNBUFFERED=1
timeout 290 python3 tools/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/log.txt"
