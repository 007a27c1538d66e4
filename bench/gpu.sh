#!/usr/bin/env bash
# GPU figures on a lent device (issue 11): latent_c_n4 at card A's full dimensions, bf16, SDPA,
# batch 2 — peak memory vs the card's 5.46 GB, seconds per step, and samples/s of the routed DiT
# (N=4, depth 4) vs the same DiT cross-attending all 12 layers (latent_c_n12_dense). A few minutes.
#
# Writes $OUT/gpu_result.json (or bench/gpu_result.json without $OUT); commit that file as
# bench/gpu_result.json and `python -m bench.run` reports it on machines without a GPU.
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

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
RESULT="${OUT:-bench}/gpu_result.json"
timeout "${GPU_BENCH_TIMEOUT:-480}" "$PY" -m bench.gpu --out "$RESULT" --steps "${GPU_BENCH_STEPS:-10}"
echo "gpu.sh: wrote $RESULT"
