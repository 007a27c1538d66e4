#!/usr/bin/env bash
# Create .venv and install idmctl with its pinned stack (idempotent; a no-op when up to date).
# torch==2.13.0 is pinned exactly: a range would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.idmctl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' 2>&1 \
    | grep -v "^WARNING: Location" || true
  # robosuite through the project's own import path, which keeps its five import-time warnings (macro
  # file, robosuite_models, mink IK: features this project does not use) out of every log.
  .venv/bin/python -c "import idmctl, torch, lightning_fabric, mlflow, diffusers
from trainers.sim.env import prepare_robosuite; prepare_robosuite(); import robosuite" \
    || { echo "setup: install incomplete" >&2; exit 1; }
  touch "$stamp"
fi
# PYTHONDONTWRITEBYTECODE may be set on these machines: compile our own modules once so every CLI
# start does not recompile them (stale .pyc files are simply ignored by Python).
.venv/bin/python -m compileall -q -j 0 idmctl cache trainers >/dev/null || true
