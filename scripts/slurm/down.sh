#!/usr/bin/env bash
# Stop the local Slurm cluster started by up.sh: only the daemons named in its own pid files, by
# pid (slurmd nodes, slurmctld, slurmdbd, MariaDB; munged only with --munge since other tools may
# share it). State is kept; `up.sh --clean` wipes it.
set -uo pipefail

ROOT="${IDMCTL_SLURM_ROOT:-/tmp/idmctl-slurm}"

stop_pidfile() {  # stop_pidfile PIDFILE COMM
  local pidfile="$1" comm="$2" pid
  [[ -s "$pidfile" ]] || return 0
  pid="$(tr -dc 0-9 <"$pidfile")"
  if [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm"* ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      # A zombie (state Z) counts as stopped: PID 1 reaps late here.
      [[ -r "/proc/$pid/stat" && "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != "Z" ]] || break
      sleep 0.1
    done
    if [[ -r "/proc/$pid/stat" && "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != "Z" ]]; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "slurm-down: stopped $comm ($pid)" >&2
  fi
  rm -f "$pidfile"
}

for pidfile in "$ROOT"/run/slurmd-*.pid; do
  [[ -e "$pidfile" ]] && stop_pidfile "$pidfile" slurmd
done
stop_pidfile "$ROOT/run/slurmctld.pid" slurmctld
stop_pidfile "$ROOT/run/slurmdbd.pid" slurmdbd
stop_pidfile "$ROOT/run/mysqld.pid" mariadbd
if [[ "${1:-}" == "--munge" ]]; then
  stop_pidfile /run/munge/munged.pid munged
fi
# slurmd leaves per-node cgroup directories behind; rmdir only removes empty ones.
for ctrl in memory cpuset freezer cpuacct devices; do
  for dir in /sys/fs/cgroup/$ctrl/slurm_n*; do
    [[ -d "$dir" ]] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null
  done
done
exit 0
