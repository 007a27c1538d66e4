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
# uv resolves and installs the same set as pip, in parallel: on a 2-core machine it installed with ~96 s of CPU
# (empty uv cache, bytecode compiled) where pip had taken ~159 s in CI (pip freeze of the two venvs differs
# only in the editable line's comment). It reads
# pip's own configuration (the indexes, wheel folders, constraints and CA file this machine's pip uses),
# and any failure (no uv on the registry, a resolution it refuses) falls back to pip.
install_with_uv() {
  .venv/bin/python -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 || return 1
  local args=() line key value item
  while IFS= read -r line; do
    key=${line%%=*}; value=${line#*=}; value=${value#\'}; value=${value%\'}
    case ${key#*.} in
      index-url) args+=(--index-url "$value") ;;
      extra-index-url) for item in $value; do args+=(--extra-index-url "$item"); done ;;
      find-links) for item in $value; do args+=(--find-links "$item"); done ;;
      constraint) for item in $value; do args+=(--constraint "$item"); done ;;
      cert) export SSL_CERT_FILE="$value" ;;
    esac
  done < <(.venv/bin/python -m pip config list 2>/dev/null)
  # pip takes the best version over all its indexes; uv by default only the first index naming a package.
  .venv/bin/uv pip install --quiet --python .venv/bin/python --index-strategy unsafe-best-match \
    --compile-bytecode "${args[@]}" -e '.[test]'
}
stamp=.venv/.idmctl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  install_with_uv || {
    echo "setup: uv could not install the set; installing it with pip instead" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' 2>&1 \
      | grep -v "^WARNING: Location" || true
  }
  # robosuite through the project's own import path, which keeps its five import-time warnings (macro
  # file, robosuite_models, mink IK: features this project does not use) out of every log.
  .venv/bin/python -c "import idmctl, torch, lightning_fabric, mlflow, diffusers
from trainers.sim.env import prepare_robosuite; prepare_robosuite(); import robosuite" \
    || { echo "setup: install incomplete" >&2; exit 1; }
  touch "$stamp"
fi
# PYTHONDONTWRITEBYTECODE may be set on these machines: compile our own modules once so every CLI
# start does not recompile them (stale .pyc files are simply ignored by Python). Every package of ours
# that a process imports: ground/, the floor both planes stand on, included.
.venv/bin/python -m compileall -q -j 0 ground idmctl cache trainers bench >/dev/null || true
