#!/usr/bin/env bash
# Bring up the project's local Slurm cluster: munge, MariaDB (127.0.0.1:3307, own datadir),
# slurmdbd, slurmctld and two slurmd nodes n1/n2 on this host, QoS `sub` (preemptible, requeue,
# GraceTime 10) preempted by `core-own`, fake GPUs from char devices, cgroup v1 memory enforcement
# (polling fallback when cgroup v1 memory is not writable). Each setting says what made it necessary.
#
# Idempotent: daemons already alive (checked by pid file, /proc state and comm) are left alone.
# `--clean` stops everything and wipes the state first. Exports land in $ROOT/env (source it).
# Knobs: IDMCTL_SLURM_ROOT (default /tmp/idmctl-slurm), IDMCTL_SLURM_PORT (first of 10 ports,
# default 17010; MariaDB's port moves with it, 3307 for the default), IDMCTL_SLURM_FIRST_JOB_ID (default
# 1), IDMCTL_SLURM_DBD=0 (no accounting: no QoS, no sacct), IDMCTL_SLURM_CGROUP=no. A second cluster on
# the same host (scripts/test.sh starts one per pytest worker) takes its own root and port, and job ids
# of its own: both clusters' nodes are named n1/n2, and slurmd's cgroups are per node name and job id.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../daemon_fds.sh"
# The cluster's own settings that idmctl judges (`idmctl doctor`'s "cluster settings" row, the qos check),
# so that a test can bring a cluster up with each one off and on (tests/idmctl/ops/test_cluster_settings_live.py);
# the defaults are the settings the suite's shared clusters have always had:
#   IDMCTL_SLURM_PREEMPT_SIGNAL=1 (default) writes SlurmctldParameters=preempt_send_user_signal: a preempted
#     job gets its own --signal (idmctl's B:USR1) when preemption starts; 0 leaves it out, and the job's tasks
#     get TERM at the start of GraceTime instead. Slurm 22.05 (Debian 12's) has only this spelling: its
#     slurm.conf(5) has no PreemptParameters (23.02 added PreemptParameters=send_user_signal).
#   IDMCTL_SLURM_SUB_GRACE=10 (default): the `sub` QoS's GraceTime in seconds, from the first signal to the kill.
#   IDMCTL_SLURM_MIN_JOB_AGE=300 (default): seconds slurmctld keeps an ended job (squeue/scontrol forget it then).
#   IDMCTL_SLURM_JOB_CONTAINER=none (default) or tmpfs: job_container/tmpfs, each job a private /tmp and
#     /dev/shm under /var/tmp/<root's name>-job_container (job_container.conf beside slurm.conf); needs root and mount
#     namespaces. A change of it takes a restart of slurmctld and the slurmds (down.sh, then up.sh).
ROOT="${IDMCTL_SLURM_ROOT:-/tmp/idmctl-slurm}"
PORT="${IDMCTL_SLURM_PORT:-17010}"
WITH_DBD="${IDMCTL_SLURM_DBD:-1}"
CLUSTER=idmctl
NODES=(n1 n2)
HOST="$(hostname -s)"
DB_PORT=$((3307 + PORT - 17010))
FIRST_JOB_ID="${IDMCTL_SLURM_FIRST_JOB_ID:-1}"
PREEMPT_SIGNAL="${IDMCTL_SLURM_PREEMPT_SIGNAL:-1}"
SUB_GRACE="${IDMCTL_SLURM_SUB_GRACE:-10}"
MIN_JOB_AGE="${IDMCTL_SLURM_MIN_JOB_AGE:-300}"
JOB_CONTAINER="${IDMCTL_SLURM_JOB_CONTAINER:-none}"
JOB_CONTAINER_BASE="/var/tmp/$(basename "$ROOT")-job_container"
[[ "$PREEMPT_SIGNAL" =~ ^[01]$ ]] || { echo "slurm-up: error: IDMCTL_SLURM_PREEMPT_SIGNAL=$PREEMPT_SIGNAL: use 0 or 1" >&2; exit 2; }
[[ "$SUB_GRACE" =~ ^[0-9]+$ ]] || { echo "slurm-up: error: IDMCTL_SLURM_SUB_GRACE=$SUB_GRACE: use whole seconds" >&2; exit 2; }
[[ "$MIN_JOB_AGE" =~ ^[0-9]+$ ]] || { echo "slurm-up: error: IDMCTL_SLURM_MIN_JOB_AGE=$MIN_JOB_AGE: use whole seconds" >&2; exit 2; }
[[ "$JOB_CONTAINER" =~ ^(none|tmpfs)$ ]] || { echo "slurm-up: error: IDMCTL_SLURM_JOB_CONTAINER=$JOB_CONTAINER: use none or tmpfs" >&2; exit 2; }

if [[ "${1:-}" == "--clean" ]]; then
  "$HERE/down.sh" || true
  rm -rf "$ROOT"
fi

log() { echo "slurm-up: $*" >&2; }
die() { echo "slurm-up: error: $*" >&2; exit 1; }

# A pid file names a live daemon only if the process exists, is not a zombie (PID 1 here reaps
# exited daemons late, so kill -0 succeeds on a dead one) and has the expected command name.
alive() {
  local pidfile="$1" comm="$2" pid state
  [[ -s "$pidfile" ]] || return 1
  pid="$(tr -dc 0-9 <"$pidfile")"
  [[ -n "$pid" && -r "/proc/$pid/stat" ]] || return 1
  state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" || return 1
  [[ "$state" != "Z" ]] || return 1
  [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm"* ]]
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit="$1" what="$2"; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || die "$what not ready after ${limit}s (logs: $ROOT/log)"
    sleep 0.2
  done
}

for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || [[ -x "/usr/sbin/$tool" ]] || die "$tool missing: run scripts/system_deps.sh"
done

mkdir -p "$ROOT"/{etc,state,spool,log,run,fakegpu}
chmod 755 "$ROOT"

# ---- cgroup v1 memory: enforce OOM through cgroups when we may create groups there -----------
CGROUP="${IDMCTL_SLURM_CGROUP:-auto}"
if [[ "$CGROUP" == auto ]]; then
  probe="/sys/fs/cgroup/memory/idmctl_probe_$$"
  if mkdir "$probe" 2>/dev/null; then rmdir "$probe"; CGROUP=yes; else CGROUP=no; fi
fi

# ---- fake GPUs: gres needs character devices (regular files are rejected) ---------------------
for i in 0 1; do
  [[ -c "$ROOT/fakegpu/gpu$i" ]] || { rm -f "$ROOT/fakegpu/gpu$i"; mknod "$ROOT/fakegpu/gpu$i" c 1 3; }
done

# ---- node names resolve to this host (Fabric/torch.distributed use SLURM_NODELIST's first name as
# MASTER_ADDR, as on a real cluster) -------------------------------------------------------------
for node in "${NODES[@]}"; do
  getent hosts "$node" >/dev/null || echo "127.0.0.1 $node  # idmctl local Slurm" >>/etc/hosts \
    || log "warning: cannot add $node to /etc/hosts; multi-rank jobs will not find MASTER_ADDR=$node"
done

# ---- configuration ---------------------------------------------------------------------------
CPUS="$(nproc)"
MEM_MB=4096
ETC="$ROOT/etc"
{
  echo "ClusterName=$CLUSTER"
  echo "SlurmctldHost=$HOST(127.0.0.1)"
  echo "SlurmctldPort=$PORT"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "AuthInfo=cred_expire=30"
  echo "StateSaveLocation=$ROOT/state"
  echo "SlurmdSpoolDir=$ROOT/spool/%n"
  echo "SlurmctldPidFile=$ROOT/run/slurmctld.pid"
  echo "SlurmdPidFile=$ROOT/run/slurmd-%n.pid"
  echo "SlurmctldLogFile=$ROOT/log/slurmctld.log"
  echo "SlurmdLogFile=$ROOT/log/slurmd-%n.log"
  echo "MailProg=/bin/true"
  echo "ReturnToService=2"
  echo "MinJobAge=$MIN_JOB_AGE"
  echo "FirstJobId=$FIRST_JOB_ID"
  echo "InactiveLimit=0"
  echo "KillWait=5"
  echo "SchedulerType=sched/backfill"
  echo "SchedulerParameters=bf_interval=2,sched_interval=5"
  if [[ "$PREEMPT_SIGNAL" == 1 ]]; then echo "SlurmctldParameters=preempt_send_user_signal"; fi
  if [[ "$JOB_CONTAINER" == tmpfs ]]; then
    echo "JobContainerType=job_container/tmpfs"
    echo "PrologFlags=Contain"  # every Slurm command refuses job_container/tmpfs without it
  fi
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core_Memory"
  echo "DefMemPerCPU=256"
  echo "GresTypes=gpu"
  echo "JobCompType=jobcomp/filetxt"
  echo "JobCompLoc=$ROOT/log/jobcomp.txt"
  if [[ "$CGROUP" == yes ]]; then
    echo "ProctrackType=proctrack/cgroup"
    echo "TaskPlugin=task/cgroup,task/affinity"
    echo "JobAcctGatherType=jobacct_gather/cgroup"
  else
    # No writable cgroup v1 memory: only polling can kill, and it ends FAILED, not OUT_OF_MEMORY.
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/affinity"
    echo "JobAcctGatherType=jobacct_gather/linux"
    echo "JobAcctGatherParams=OverMemoryKill"
    echo "JobAcctGatherFrequency=1"
  fi
  if [[ "$WITH_DBD" == 1 ]]; then
    echo "AccountingStorageType=accounting_storage/slurmdbd"
    echo "AccountingStorageHost=127.0.0.1"
    echo "AccountingStoragePort=$((PORT + 9))"
    echo "AccountingStorageTRES=gres/gpu"
    echo "AccountingStorageEnforce=associations,qos"
    echo "PreemptType=preempt/qos"
  else
    echo "PreemptType=preempt/partition_prio"
  fi
  echo "PreemptMode=REQUEUE"
  i=0
  for node in "${NODES[@]}"; do
    i=$((i + 1))
    echo "NodeName=$node NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT + i)) CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB Gres=gpu:fake:2 State=UNKNOWN"
  done
  echo "PartitionName=main Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$ETC/slurm.conf.new"
mv "$ETC/slurm.conf.new" "$ETC/slurm.conf"

cat >"$ETC/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
ConstrainCores=yes
ConstrainDevices=no
EOF
echo "NodeName=$(IFS=,; echo "${NODES[*]}") Name=gpu Type=fake File=$ROOT/fakegpu/gpu[0-1]" >"$ETC/gres.conf"
if [[ "$JOB_CONTAINER" == tmpfs ]]; then
  # Both nodes run on this host: one base path serves them, each job's directory is named by its id.
  # Not under $ROOT: slurmd 22.05 refuses any BasePath under /tmp ("Cannot use /tmp or /dev/shm as BasePath").
  mkdir -p "$JOB_CONTAINER_BASE"
  echo "AutoBasePath=true" >"$ETC/job_container.conf"
  echo "BasePath=$JOB_CONTAINER_BASE" >>"$ETC/job_container.conf"
else
  rm -f "$ETC/job_container.conf"
fi

export SLURM_CONF="$ETC/slurm.conf"
cat >"$ROOT/env" <<EOF
export SLURM_CONF=$ETC/slurm.conf
export IDMCTL_SLURM_ROOT=$ROOT
EOF

# ---- munge -----------------------------------------------------------------------------------
if ! alive /run/munge/munged.pid munged; then
  # After kill -9 munged leaves socket, lock and pid behind and refuses to start until they are removed.
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged
  wait_for 10 munged munge -n
  log "munged started"
fi

# ---- MariaDB + slurmdbd ----------------------------------------------------------------------
if [[ "$WITH_DBD" == 1 ]]; then
  DB_DIR="$ROOT/mysql"
  DB_SOCK="$ROOT/run/mysqld.sock"
  DB_PID="$ROOT/run/mysqld.pid"
  DB_PASS=idmctl-local
  if ! alive "$DB_PID" mariadbd; then
    if [[ ! -d "$DB_DIR/mysql" ]]; then
      mkdir -p "$DB_DIR"
      mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR" --auth-root-authentication-method=normal \
        --skip-test-db >"$ROOT/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $ROOT/log/mariadb-install.log)"
    fi
    # Its own session: mariadbd does not daemonise, and a kill of the caller's process group (a CI
    # step or shell job ending) must not take the accounting database down under slurmdbd.
    setsid /usr/sbin/mariadbd --no-defaults --user=root --datadir="$DB_DIR" --bind-address=127.0.0.1 --port=$DB_PORT \
      --socket="$DB_SOCK" --pid-file="$DB_PID" --skip-name-resolve --log-error="$ROOT/log/mariadb.log" \
      --innodb-buffer-pool-size=32M --innodb-log-file-size=8M >/dev/null 2>&1 &
    wait_for 30 mariadb mariadb --no-defaults -uroot --socket="$DB_SOCK" -e "select 1"
    mariadb --no-defaults -uroot --socket="$DB_SOCK" <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
    log "mariadb started on 127.0.0.1:$DB_PORT"
  fi
  cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$((PORT + 9))
SlurmUser=root
PidFile=$ROOT/run/slurmdbd.pid
LogFile=$ROOT/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$ETC/slurmdbd.conf"  # slurmdbd refuses a readable one
  if ! alive "$ROOT/run/slurmdbd.pid" slurmdbd; then
    /usr/sbin/slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
    log "slurmdbd started"
  fi
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
  # QoS tiers mirroring clusters/local-slurm.yaml; `sub` is preempted (requeued) by core-own.
  # `core-reserved` exists but is never granted to the user: the profile lists it, the cluster refuses
  # it ("Invalid qos specification"), so submit's `sbatch --test-only` verdict has a refusal to meet.
  existing="$(sacctmgr -n -P list qos format=name)"
  for qos in core-own core-extra share sub core-reserved; do
    grep -qx -- "$qos" <<<"$existing" || sacctmgr -i add qos "$qos" >/dev/null
  done
  sacctmgr -i modify qos sub set Priority=0 PreemptMode=requeue GraceTime="$SUB_GRACE" >/dev/null
  sacctmgr -i modify qos core-own set Priority=100 Preempt=sub >/dev/null
  sacctmgr -i modify qos core-extra set Priority=50 Preempt=sub >/dev/null
  sacctmgr -i modify qos share set Priority=10 >/dev/null
  sacctmgr -i modify user root set qos+=core-own,core-extra,share,sub DefaultQOS=share >/dev/null
fi

# ---- slurmctld and slurmd nodes --------------------------------------------------------------
if ! alive "$ROOT/run/slurmctld.pid" slurmctld; then
  /usr/sbin/slurmctld -f "$SLURM_CONF"
  wait_for 30 slurmctld scontrol ping
  log "slurmctld started"
fi
for node in "${NODES[@]}"; do
  mkdir -p "$ROOT/spool/$node"
  if ! alive "$ROOT/run/slurmd-$node.pid" slurmd; then
    /usr/sbin/slurmd -f "$SLURM_CONF" -N "$node"
    log "slurmd $node started"
  fi
done

nodes_idle() {
  local states
  states="$(sinfo -h -N -o '%N %T' 2>/dev/null)" || return 1
  for node in "${NODES[@]}"; do
    grep -Eq "^$node (idle|mixed|allocated|completing)" <<<"$states" || return 1
  done
}
if ! nodes_idle; then
  for node in "${NODES[@]}"; do
    scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
  done
fi
wait_for 30 "nodes ${NODES[*]}" nodes_idle
log "up: SLURM_CONF=$SLURM_CONF (cgroup memory: $CGROUP, accounting: $WITH_DBD); source $ROOT/env"
