#!/usr/bin/env bash
# The README's second command (and all that .ci/run calls): set up everything the suite needs on a
# fresh Debian machine, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Debian packages and the pip set-up are independent (apt writes the system, pip writes .venv): they
# run side by side, each with its own log, and the suite waits for both. Only a Python that needs Debian's
# venv package to create .venv at all (system_deps.sh lists it then) has apt go first.
if [[ ! -x .venv/bin/python ]] && scripts/system_deps.sh --list test | grep -q -- '-venv$'; then
  scripts/system_deps.sh test
  scripts/setup.sh
else
  setup_logs=$(mktemp -d "${TMPDIR:-/tmp}/idmctl-test-setup.XXXXXX")
  echo "test: scripts/setup.sh and scripts/system_deps.sh test side by side (logs in $setup_logs)" >&2
  scripts/system_deps.sh test >"$setup_logs/system_deps.log" 2>&1 &
  deps_pid=$!
  setup_rc=0
  scripts/setup.sh >"$setup_logs/setup.log" 2>&1 || setup_rc=$?
  deps_rc=0
  wait "$deps_pid" || deps_rc=$?
  cat "$setup_logs/setup.log" "$setup_logs/system_deps.log"
  [[ $setup_rc == 0 ]] || echo "test: scripts/setup.sh failed with exit $setup_rc (its log: $setup_logs/setup.log)" >&2
  [[ $deps_rc == 0 ]] || echo "test: scripts/system_deps.sh test failed with exit $deps_rc (its log: $setup_logs/system_deps.log)" >&2
  [[ $setup_rc == 0 && $deps_rc == 0 ]] || exit 1
  rm -rf "$setup_logs"
fi
# Four xdist workers, each with a Slurm cluster of its own (below), on which its Slurm tests run one at a
# time (tests/conftest.py). More workers than cores: much of the suite's wall time is tests waiting on a
# scheduler's timers or a child process, and the extra workers keep both cores busy through those waits
# (two workers: pytest 22:36, 77 % of two cores; three: 20:31, 86 %; on 2026-12-04, three: 13:14 and four:
# 11:45 for the same code, an hour apart). A run that picks tests by name
# (`-k EXPR`, `FILE::TEST`) runs in this process instead: no workers to start, and breakpoints and -s work
# as usual. `-n N` given here wins (one cluster for all N workers: its tests grouped on one of them,
# `--dist loadgroup` unless --dist is given too); `-p no:xdist` turns the workers off.
WORKERS=4
workers=(-n "$WORKERS")
dist=(--dist loadgroup)
previous=""
chosen=""
for arg in "$@"; do
  case $arg in
    -n|-n[0-9]*|--numprocesses|--numprocesses=*) workers=(); chosen=1 ;;
    --dist|--dist=*) dist=() ;;
    -pno:xdist) workers=(); dist=(); chosen=1 ;;
    no:xdist) [[ $previous == -p ]] && { workers=(); dist=(); chosen=1; } ;;
    -k|-k?*|*::*) [[ -z $chosen ]] && workers=(-n 0) ;;
  esac
  previous=$arg
done
# Local Slurm clusters for the `slurm`-marked tests: up once, stopped on exit (only those this run
# started). In CI their absence fails those tests instead of skipping them. One cluster per worker
# (IDMCTL_SLURM_ROOTS: tests/slurm_support.py points worker gwK at the K-th), so that the Slurm tests, which
# spend their time waiting on the scheduler's timers (GraceTime, requeue holds, TIMEOUT, sacct's lag),
# wait on every cluster at once instead of one after another on one (1,032 s of the suite's tests did).
# The K-th cluster (K from 0) has its own root ($IDMCTL_SLURM_ROOT-(K+1) after the first), ports (17010 + 20·K,
# MariaDB 3307 + 20·K) and job ids (FirstJobId 1 + 3000·K: its jobs' MASTER_PORT, 15000 + id % 10000, and
# their cgroups never meet another cluster's).
SLURM_ROOT="${IDMCTL_SLURM_ROOT:-/tmp/idmctl-slurm}"
SLURM_PORT="${IDMCTL_SLURM_PORT:-17010}"
slurm_roots=("$SLURM_ROOT")
if [[ "${workers[*]}" == "-n $WORKERS" ]]; then
  for ((k = 2; k <= WORKERS; k++)); do slurm_roots+=("$SLURM_ROOT-$k"); done
fi
slurm_ours=()
cluster_up() {  # cluster_up INDEX: bring up the INDEX-th cluster, cancel what a killed run left on it
  local root="${slurm_roots[$1]}" port=$((SLURM_PORT + 20 * $1)) first=$((1 + 3000 * $1)) up=0 stale
  if [[ -f "$root/env" ]] && (source "$root/env" && scontrol ping >/dev/null 2>&1); then up=1; fi
  IDMCTL_SLURM_ROOT="$root" IDMCTL_SLURM_PORT="$port" IDMCTL_SLURM_FIRST_JOB_ID="$first" scripts/slurm/up.sh
  # A cluster this run started had no one on it: any job its controller still lists is left from a run
  # that was killed with the cluster (its job steps gone with it), and slurmctld would keep that job
  # RUNNING on its node for minutes. Seen: a killed suite's requeued build held n1 for 18 min and the
  # next suite's two-node and idle-node waits timed out.
  if [[ "$up" == 0 ]]; then
    slurm_ours+=("$root")
    mapfile -t stale < <(source "$root/env" && squeue -h -o %i)
    if ((${#stale[@]})); then
      echo "test: cancelling job(s) ${stale[*]} left in $root's controller state by an earlier run" >&2
      (source "$root/env" && scancel "${stale[@]}") || true
    fi
  fi
}
for index in "${!slurm_roots[@]}"; do cluster_up "$index"; done
source "$SLURM_ROOT/env"
export IDMCTL_SLURM_ROOTS="${slurm_roots[*]}"
# A private PostgreSQL for the shared-store tests (IDMCTL_DB_URL): the same up-once, stop-if-ours rule.
PG_ROOT="${IDMCTL_PG_ROOT:-/tmp/idmctl-pg}"
pg_already_up=0
if [[ -s "$PG_ROOT/data/postmaster.pid" ]] && kill -0 "$(head -1 "$PG_ROOT/data/postmaster.pid")" 2>/dev/null; then pg_already_up=1; fi
scripts/postgres/up.sh
source "$PG_ROOT/env"
stop_ours() {
  local root
  for root in "${slurm_ours[@]}"; do IDMCTL_SLURM_ROOT="$root" scripts/slurm/down.sh; done
  if [[ "$pg_already_up" == 0 ]]; then scripts/postgres/down.sh; fi
}
trap stop_ours EXIT
# --durations=25: every run ends with where its time went (a later --durations in "$@" wins).
.venv/bin/python -m pytest "${workers[@]}" "${dist[@]}" --durations=25 "$@"
