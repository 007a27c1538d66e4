#!/usr/bin/env bash
# Stop the private PostgreSQL started by up.sh (pg_ctl stop -m fast on its own data directory).
# Data is kept; `up.sh --clean` wipes it. Does nothing when it is not running.
set -uo pipefail

ROOT="${IDMCTL_PG_ROOT:-/tmp/idmctl-pg}"
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[[ -s "$ROOT/data/postmaster.pid" && -n "$BIN" ]] || exit 0
pid="$(head -1 "$ROOT/data/postmaster.pid" | tr -dc 0-9)"
[[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == postgres* ]] || { rm -f "$ROOT/data/postmaster.pid"; exit 0; }
if [[ "$(id -u)" == 0 ]]; then
  runuser -u "$(stat -c %U "$ROOT/data")" -- "$BIN/pg_ctl" -D "$ROOT/data" -m fast -w stop >/dev/null
else
  "$BIN/pg_ctl" -D "$ROOT/data" -m fast -w stop >/dev/null
fi
echo "postgres-down: stopped ($pid)" >&2
