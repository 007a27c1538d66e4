#!/usr/bin/env bash
# The README's first command: install what it needs (Debian packages for offscreen rendering, .venv
# with the pinned stack), then run the main loop on embedded defaults (SQLite store, local executor,
# MLflow SQLite store) under $IDMCTL_HOME (default ./.idmctl). `idmctl quickstart` starts with
# `idmctl doctor`.
#
# A failing step ends in one line: what failed and what to do. --debug shows every step's output
# and the Python traceback.
set -uo pipefail
cd "$(dirname "$0")/.."
debug=0
for arg in "$@"; do [[ $arg == --debug ]] && debug=1; done
logs=${TMPDIR:-/tmp}/idmctl-quickstart-$(id -u)
mkdir -p "$logs"

# step NAME WHAT-TO-DO COMMAND...: the command's output goes to a log (to the terminal with --debug).
step() {
  local name=$1 todo=$2 log="$logs/${1// /-}.log" started=$SECONDS code=0
  shift 2
  if [[ $debug == 1 ]]; then
    echo "quickstart: $name ..."
    "$@" || code=$?
  else
    printf 'quickstart: %s ... ' "$name"
    "$@" >"$log" 2>&1 || code=$?
  fi
  if [[ $code != 0 ]]; then
    [[ $debug == 1 ]] || echo "failed"
    local where="its output is above"
    [[ $debug == 1 ]] || where="its output: $log; --debug shows it"
    echo "quickstart: $name failed (exit $code): $todo ($where)" >&2
    exit 1
  fi
  if [[ $debug == 1 ]]; then echo "quickstart: $name ready ($((SECONDS - started)) s)"; else echo "ready ($((SECONDS - started)) s)"; fi
}

step "Debian packages" "run scripts/system_deps.sh quickstart as root, or install the packages it lists with --list" \
  scripts/system_deps.sh quickstart
step "Python environment" "check the connection to the package index and the free disk space, then rerun (rm -rf .venv for a clean one)" \
  scripts/setup.sh
export IDMCTL_HOME=${IDMCTL_HOME:-$PWD/.idmctl}
exec .venv/bin/idmctl quickstart "$@"
