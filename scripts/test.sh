#!/usr/bin/env bash
# The README's second command (and all that .ci/run calls): set up everything the suite needs on a
# fresh Debian machine, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/system_deps.sh test
# The local Slurm cluster for the `slurm`-marked tests: up once, stopped on exit (only if this run
# started it). In CI its absence fails those tests instead of skipping them.
SLURM_ROOT="${IDMCTL_SLURM_ROOT:-/tmp/idmctl-slurm}"
already_up=0
if [[ -f "$SLURM_ROOT/env" ]] && (source "$SLURM_ROOT/env" && scontrol ping >/dev/null 2>&1); then already_up=1; fi
scripts/slurm/up.sh
source "$SLURM_ROOT/env"
# A private PostgreSQL for the shared-store tests (IDMCTL_DB_URL): the same up-once, stop-if-ours rule.
PG_ROOT="${IDMCTL_PG_ROOT:-/tmp/idmctl-pg}"
pg_already_up=0
if [[ -s "$PG_ROOT/data/postmaster.pid" ]] && kill -0 "$(head -1 "$PG_ROOT/data/postmaster.pid")" 2>/dev/null; then pg_already_up=1; fi
scripts/postgres/up.sh
source "$PG_ROOT/env"
stop_ours() {
  if [[ "$already_up" == 0 ]]; then scripts/slurm/down.sh; fi
  if [[ "$pg_already_up" == 0 ]]; then scripts/postgres/down.sh; fi
}
trap stop_ours EXIT
.venv/bin/python -m pytest "$@"
