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
if [[ "$already_up" == 0 ]]; then trap 'scripts/slurm/down.sh' EXIT; fi
.venv/bin/python -m pytest "$@"
