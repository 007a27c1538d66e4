#!/usr/bin/env bash
# The README's first command: set up, then run the main loop on embedded defaults
# (SQLite store, local executor, MLflow SQLite store) under $IDMCTL_HOME (default ./.idmctl).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export IDMCTL_HOME=${IDMCTL_HOME:-$PWD/.idmctl}
exec .venv/bin/idmctl quickstart "$@"
