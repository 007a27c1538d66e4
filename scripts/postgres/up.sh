#!/usr/bin/env bash
# Bring up a private PostgreSQL 15 cluster for the tests (and for trying a team store locally):
# initdb into $ROOT/data, listening on 127.0.0.1:$PORT and a socket in $ROOT/run, one login role
# `idmctl` (password `idmctl`, CREATEDB so each test can make its own database) owning the
# databases `idmctl` and `mlflow`, and a member of pg_signal_backend so a test's
# `DROP DATABASE … WITH (FORCE)` may end an autovacuum worker that has just connected to the new
# database (a CI run of 2026-12-04 failed a teardown on exactly that). Exports land in $ROOT/env
# (source it): IDMCTL_TEST_PG_URL is a URL the tests create their own databases with.
#
# PostgreSQL refuses to run as root: as root the server runs as the `postgres` system user (Debian's
# package creates it), otherwise as the calling user. Idempotent: a live server (pid file + /proc
# comm) is left alone. `--clean` stops it and wipes the data first.
# Knobs: IDMCTL_PG_ROOT (default /tmp/idmctl-pg), IDMCTL_PG_PORT (default 15432).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../daemon_fds.sh"
ROOT="${IDMCTL_PG_ROOT:-/tmp/idmctl-pg}"
PORT="${IDMCTL_PG_PORT:-15432}"
ROLE=idmctl
PASSWORD=idmctl

log() { echo "postgres-up: $*" >&2; }
die() { echo "postgres-up: error: $*" >&2; exit 1; }

if [[ "${1:-}" == "--clean" ]]; then
  "$HERE/down.sh" || true
  rm -rf "$ROOT"
fi

BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[[ -n "$BIN" && -x "$BIN/initdb" ]] || die "PostgreSQL server binaries missing: run scripts/system_deps.sh (apt-get install postgresql)"

if [[ "$(id -u)" == 0 ]]; then
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
  OWNER=postgres
  as_owner() { runuser -u postgres -- "$@"; }
else
  OWNER="$(id -un)"
  as_owner() { "$@"; }
fi

mkdir -p "$ROOT/run" "$ROOT/log"
chown "$OWNER" "$ROOT" "$ROOT/run" "$ROOT/log"
chmod 755 "$ROOT"

if [[ ! -s "$ROOT/data/PG_VERSION" ]]; then
  log "initdb $ROOT/data"
  rm -rf "$ROOT/data"
  as_owner "$BIN/initdb" -D "$ROOT/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >"$ROOT/log/initdb.log" 2>&1 || die "initdb failed (see $ROOT/log/initdb.log)"
fi

alive() {
  local pid
  [[ -s "$ROOT/data/postmaster.pid" ]] || return 1
  pid="$(head -1 "$ROOT/data/postmaster.pid" | tr -dc 0-9)"
  [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == postgres* ]]
}

if alive; then
  log "already running on port $PORT"
else
  rm -f "$ROOT/data/postmaster.pid"
  as_owner "$BIN/pg_ctl" -D "$ROOT/data" -l "$ROOT/log/postgres.log" -w -t 60 \
    -o "-k $ROOT/run -p $PORT -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" start >/dev/null \
    || die "pg_ctl start failed (see $ROOT/log/postgres.log)"
  log "started on 127.0.0.1:$PORT"
fi

psql_admin() { as_owner "$BIN/psql" -h "$ROOT/run" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
if [[ -z "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname='$ROLE'")" ]]; then
  psql_admin -c "CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD'"
fi
if [[ "$(psql_admin -c "SELECT pg_has_role('$ROLE', 'pg_signal_backend', 'MEMBER')")" != t ]]; then
  psql_admin -c "GRANT pg_signal_backend TO $ROLE"
fi
for db in idmctl mlflow; do
  if [[ -z "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname='$db'")" ]]; then
    psql_admin -c "CREATE DATABASE $db OWNER $ROLE"
  fi
done

cat >"$ROOT/env" <<ENV
export IDMCTL_PG_ROOT=$ROOT
export IDMCTL_TEST_PG_URL=postgresql://$ROLE:$PASSWORD@127.0.0.1:$PORT/idmctl
ENV
log "ready: source $ROOT/env"
