#!/usr/bin/env bash
# Keep every core busy while something else runs, to prove it does not depend on a quiet machine.
#
#   scripts/cpu_hog.sh -- scripts/test.sh            # the whole suite under load; exits with its code
#   scripts/cpu_hog.sh -n 1 -- scripts/quickstart.sh # one busy core instead of all of them
#   scripts/cpu_hog.sh start                         # hogs in the background (pids in $CPU_HOG_PIDFILE) ...
#   scripts/cpu_hog.sh stop                          # ... until this
#
# Each hog is a shell busy loop at normal priority: it competes for the CPU exactly as another
# user's job would. The hogs end with the wrapped command, on Ctrl-C, and on `kill` of this script.
set -euo pipefail
PIDFILE=${CPU_HOG_PIDFILE:-/tmp/idmctl-cpu-hog.pids}
n=$(nproc)

usage() { sed -n '2,10s/^# \{0,1\}//p' "$0" >&2; exit 2; }

hogs=()
start_hogs() {
  local i
  for ((i = 0; i < n; i++)); do
    ( while :; do :; done ) </dev/null >/dev/null 2>&1 &
    hogs+=($!)
  done
}

stop_pids() {
  local pid
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

mode=run
while [[ $# -gt 0 ]]; do
  case $1 in
    -n) [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || usage; n=$2; shift 2 ;;
    --) shift; break ;;
    start|stop) mode=$1; shift ;;
    *) usage ;;
  esac
done

if [[ $mode == start ]]; then
  [[ -s $PIDFILE ]] && { echo "cpu_hog: already running (pids in $PIDFILE; \`$0 stop\` first)" >&2; exit 1; }
  start_hogs
  printf '%s\n' "${hogs[@]}" >"$PIDFILE"
  echo "cpu_hog: $n busy loop(s) started, pids ${hogs[*]} (stop: $0 stop)"
  exit 0
fi
if [[ $mode == stop ]]; then
  [[ -s $PIDFILE ]] || { echo "cpu_hog: not running"; exit 0; }
  mapfile -t pids <"$PIDFILE"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -f "$PIDFILE"
  echo "cpu_hog: stopped ${#pids[@]} busy loop(s)"
  exit 0
fi
[[ $# -gt 0 ]] || usage

start_hogs
trap 'stop_pids "${hogs[@]}"' EXIT
echo "cpu_hog: $n busy loop(s) on $(nproc) core(s) while: $*" >&2
set +e
# In the background (stdin kept) so that a signal to this script is handled at once: `wait` returns,
# the trap passes the signal on to the command, and the EXIT trap stops the hogs.
"$@" <&0 &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; exit 143' TERM
trap 'kill -INT "$child" 2>/dev/null; exit 130' INT
wait "$child"
exit $?
