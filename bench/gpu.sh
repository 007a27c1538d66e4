#!/usr/bin/env bash
# The GPU figures and the GPU proof on one lent GPU, in under 5 minutes:
#   bench/gpu.sh [--device cuda|cpu] [DIR]        (DIR: $OUT, else bench/)
# 1. bench.gpu: latent_c_n4 at card A's full dimensions, bf16, SDPA, batch 2 — peak memory vs the
#    card's 5.46 GB, seconds per step, routed (N=4) vs dense (N=12) samples/s;
# 2. bench.gpu_proof: the full-size N=4 smoke at B=2 (peak memory, dataset / first sample / model
#    build / step times vs the card's 23 s / 0.7 s / 39 s, finite losses), one Fabric bf16-mixed DDP
#    step on 1 GPU, a full-width (5120 × 36 blocks) hidden-cache build of one window, and NVML's
#    utilisation as the efficiency report reads it.
# 3. bench.gpu_loader: the loader's old and new paths side by side (see below).
# Writes DIR/gpu_result.json, DIR/gpu_proof.json, DIR/gpu_loader.json and DIR/BENCHMARKS.md (two sections, by
# bench/run.py). Commit the two JSON files under bench/ and `python -m bench.run` reports them in
# BENCHMARKS.md on machines without a GPU. `--device cpu` runs every line at reduced sizes (CI:
# tests/bench/test_gpu_bench.py); its figures say "not measured on a GPU".
#
# The device image (Python 3.12) has torch, numpy, pyyaml, lightning, transformers and huggingface_hub
# 1.x, but not pydantic, diffusers, h5py, safetensors or lightning_fabric. Before the run, on the
# developer machine, put their wheels in .whl/ (ignored: echo /.whl/ >> .git/info/exclude), name .whl in
# the run's carry, and leave huggingface_hub out: the image's transformers refuses hub 2.x at import
# (diffusers then fails to import its Wan VAE), and its hub 1.x is one diffusers accepts:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl \
#       pydantic pydantic-core annotated-types typing-inspection typing-extensions diffusers h5py safetensors \
#       lightning-fabric lightning-utilities importlib-metadata zipp regex filelock fsspec tqdm packaging \
#       pillow requests urllib3 certifi idna charset-normalizer click anyio h11 truststore pyyaml
# (the versions .venv has: `pip freeze` there). Measured this way on a lent H200 on 2026-12-04: the
# whole script took 72 s, bench/gpu_result.json and bench/gpu_proof.json are that run.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] && .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null && PY=.venv/bin/python
# find_spec, not import: importing diffusers alone costs ~4 s of CPU, and the run imports them all anyway.
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in
    ('pydantic', 'yaml', 'diffusers', 'h5py', 'safetensors', 'lightning_fabric')))" 2>/dev/null; then
  compgen -G ".whl/*.whl" >/dev/null || { echo "gpu.sh: error: pydantic, diffusers, h5py, safetensors or lightning_fabric missing and no .whl/ to install them from (see the header)" >&2; exit 2; }
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
# 3. bench.gpu_loader: the loader old (float32 on the host, collate, blocking copy) vs new (bf16 pinned
#    buffers read ahead, non_blocking), 100 steps each at B=2: data_wait_frac, NVML utilisation, s/step,
#    H2D bytes per step. Prepared without a GPU (run on the CPU at reduced size only); new path first, each
#    path written when it ends, so a timeout in the slow old path keeps the new one's figures.
LOADER_STEPS="${GPU_LOADER_STEPS:-100}"; [[ "$DEVICE" == cpu ]] && LOADER_STEPS=4
timeout "${GPU_LOADER_TIMEOUT:-240}" "$PY" -m bench.gpu_loader --device "$DEVICE" --out "$DIR/gpu_loader.json" \
  --steps "$LOADER_STEPS" --warmup "$([[ "$DEVICE" == cpu ]] && echo 1 || echo 10)" > /dev/null || \
  echo "gpu.sh: bench.gpu_loader ended early (exit $?); $DIR/gpu_loader.json holds the paths that finished" >&2
echo "gpu.sh: wrote $DIR/gpu_result.json, $DIR/gpu_proof.json, $DIR/gpu_loader.json, $DIR/BENCHMARKS.md"
