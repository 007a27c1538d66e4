#!/usr/bin/env bash
# The GPU figures and the GPU proof on one lent GPU, in under 5 minutes:
#   bench/gpu.sh [--device cuda|cpu] [DIR]        (DIR: $OUT, else bench/)
# 1. bench.gpu: latent_c_n4 at card A's full dimensions, bf16, SDPA, batch 2 — peak memory vs the
#    card's 5.46 GB, seconds per step, routed (N=4) vs dense (N=12) samples/s;
# 2. bench.gpu_proof: the full-size N=4 smoke at B=2 (peak memory, dataset / first sample / model
#    build / step times vs the card's 23 s / 0.7 s / 39 s, finite losses), one Fabric bf16-mixed DDP
#    step on 1 GPU, a full-width (5120 × 36 blocks) hidden-cache build of one window, and NVML's
#    utilisation as the efficiency report reads it.
# Writes DIR/gpu_result.json, DIR/gpu_proof.json and DIR/BENCHMARKS.md (those two sections, by
# bench/run.py). Commit the two JSON files under bench/ and `python -m bench.run` reports them in
# BENCHMARKS.md on machines without a GPU. `--device cpu` runs every line at reduced sizes (CI:
# tests/bench/test_gpu_bench.py); its figures say "not measured on a GPU".
#
# The device image has torch, numpy, pyyaml and lightning but not pydantic. Before the run, on the
# developer machine, put its wheels in .whl/ (ignored: echo /.whl/ >> .git/info/exclude) and carry it:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       pydantic pydantic-core annotated-types typing-inspection
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch" 2>/dev/null && PY=.venv/bin/python
if ! "$PY" -c "import pydantic, yaml" 2>/dev/null; then
  compgen -G ".whl/*.whl" >/dev/null || { echo "gpu.sh: error: pydantic missing and no .whl/ to install it from (see the header)" >&2; exit 2; }
  "$PY" -m pip install --quiet --no-deps --no-index --target .whl/site .whl/*.whl
  export PYTHONPATH="$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}"
fi

DEVICE=cuda
if [[ "${1:-}" == "--device" ]]; then DEVICE="${2:?--device needs cuda or cpu}"; shift 2; fi
[[ "$DEVICE" == cuda || "$DEVICE" == cpu ]] || { echo "gpu.sh: error: --device $DEVICE: use cuda or cpu" >&2; exit 2; }
DIR="${1:-${OUT:-bench}}"
mkdir -p "$DIR"
[[ "$DEVICE" == cuda ]] && { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; }
STEPS="${GPU_BENCH_STEPS:-10}"; [[ "$DEVICE" == cpu ]] && STEPS=1
# Budget: 5 minutes in all; the figures ~2 min, the proof ~2 min (its 14B-wide build dominates).
timeout "${GPU_BENCH_TIMEOUT:-140}" "$PY" -m bench.gpu --device "$DEVICE" --out "$DIR/gpu_result.json" --steps "$STEPS" \
  $([[ "$DEVICE" == cpu ]] && echo --warmup 1) > "$DIR/gpu_stdout.json"
timeout "${GPU_PROOF_TIMEOUT:-150}" "$PY" -m bench.gpu_proof --device "$DEVICE" --out "$DIR"
GPU_BENCH_RESULTS="$DIR" "$PY" -m bench.run --only gpu gpu_proof --out "$DIR/BENCHMARKS.md"
echo "gpu.sh: wrote $DIR/gpu_result.json, $DIR/gpu_proof.json, $DIR/BENCHMARKS.md"
