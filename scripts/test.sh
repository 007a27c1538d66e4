#!/usr/bin/env bash
# The README's second command (and all that .ci/run calls): set up everything the suite needs on a
# fresh Debian machine, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/system_deps.sh
exec .venv/bin/python -m pytest "$@"
