#!/usr/bin/env bash
# The prepared check of the `cuda` backend on a machine with an NVIDIA GPU (issue #35):
# installs nothing from the network, builds random models, runs the op witness, the
# exactness and sync checks on the device and a short benchmark against torch's eager path,
# within five minutes, and writes JSON to $OUT (default ./gpu_check_out).
#
# The GPU machine has its own Python with torch, Triton, transformers (and so tqdm, pyyaml,
# requests), safetensors and numpy, and reaches no registry. The only other import on this
# script's path is gguf-py, which travels as a wheel in .whl/ (git-ignored), fetched with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl gguf
# (MEASUREMENTS.md lists what that machine lacks).
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
timeout ${CHECK_TIMEOUT:-290} python3 tools/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/log.txt"
