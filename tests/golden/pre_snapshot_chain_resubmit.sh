#!/bin/bash
#SBATCH --job-name=quickstart
#SBATCH --qos=core-own
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --mem=4G
#SBATCH --time=0-00:30:00
#SBATCH --output=/home/operator/idmctl/runs/quickstart/3/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@60
# idmctl: step time 0.131 ms/step (data-bound lower bound; compute unmeasured (no CPU smoke); estimate: max(storage 0.131 ms, loader CPU unmeasured, compute unmeasured) + 0 s not overlapped (num_workers 0: the rank's batch loader reads 2 batches ahead on threads) = 0.131 ms/step, bound by storage); checkpoint write unknown (no smoke or earlier run measured one)
# idmctl: time limit = 0-00:30:00 (from resources.time_limit 0:30:00); derived would be: (200 steps × 0.131 ms/step) × 1.25 margin = 0.0 s, at least 30.0 min for start-up and evaluation → 0-00:30:00 (a lower bound: the step time holds no compute)
# idmctl: checkpoint interval = 50 steps (from train.checkpoint_every 50); derived would be: non-preemptible core-own: lose at most 4.0 h to a failure → interval ≤ 4.0 h; 4.0 h ÷ 0.131 ms/step = 200 steps (the whole run)
# idmctl: signal lead = 60 s (derived): (0.131 ms step + unmeasured write) × 3 = 0.393 ms, at least 60 s (Slurm's timer) → 60.0 s
set -uo pipefail
export IDMCTL_HOME=/home/operator/idmctl
export IDMCTL_CHAIN_ID=3
export IDMCTL_ATTEMPT=3
export IDMCTL_SPEC_HASH=457ac3e2b853bb05229804ad03c4f3e3d186958d7080f43c7e2aa1757d9626d0
export PYTHONUNBUFFERED=1
export IDMCTL_RUN_DIR=/home/operator/idmctl/runs/quickstart/3
export IDMCTL_PYTHON=/opt/idmctl/venv/bin/python
export SRUN_CPUS_PER_TASK=2
export IDMCTL_CODE_VERSION=0123456789abcdef0123456789abcdef01234567
export IDMCTL_RETRY_REASON=preempted
RUN_DIR=/home/operator/idmctl/runs/quickstart/3
cd /opt/idmctl/src || exit 1
echo "idmctl: job ${SLURM_JOB_ID:-local} chain $IDMCTL_CHAIN_ID attempt $IDMCTL_ATTEMPT restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"
# code: the live tree (a job submitted before code snapshots)

# node guard: /dev/shm free vs the loader's 0 B (stale segments of dead jobs are the evidence),
# scratch vs stage-in bytes, the 0 GPUs requested visible, the cache mounted; before stage-in and training.
node_guard() {
  if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
      /opt/idmctl/venv/bin/python -m trainers.node_guard --shm-need 0 --gpus 0 --phase "$@"
  else
    /opt/idmctl/venv/bin/python -m trainers.node_guard --shm-need 0 --gpus 0 --phase "$@"
  fi
  local status=$?
  if [ "$status" -ne 0 ]; then
    echo "idmctl: node guard ($1) failed with exit $status at $(date -Is): ending the job before it runs"
    exit "$status"
  fi
}
node_guard stage --cache-root /home/operator/idmctl/quickstart/hidden_cache

# stage-in: disabled (stage.enabled: false); the trainer reads data.cache_root in place
node_guard train

# Ranks: srun under Slurm (launch per_rank: one task per rank, Fabric reads SLURM_* and needs ntasks-per-node == devices);
# the local executor runs the same script without srun. srun gets --cpus-per-task itself: since Slurm 22.05
# it does not inherit it from sbatch, and each task would be confined to one CPU.
if [ -n "${SLURM_JOB_ID:-}" ]; then LAUNCH=(srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=2); else LAUNCH=(); fi
"${LAUNCH[@]}" /opt/idmctl/venv/bin/python -m trainers.train --run-dir "$RUN_DIR" &
TRAINER=$!
# The hang watchdog: stacks of every rank, then kill, when the heartbeat stops (trainers/watchdog.py).
/opt/idmctl/venv/bin/python -m trainers.watchdog --run-dir "$RUN_DIR" --trainer-pid "$TRAINER" --k 10 --floor 120 --poll 5 --start-deadline 300 &
WATCHDOG=$!
# USR1 arrives before preemption or the time limit: pass it on so the trainer checkpoints, and
# requeue afterwards. TERM alone is scancel (or a kill): checkpoint, but never requeue a cancel.
REQUEUE_WANTED=0
notice() { echo "idmctl: $1 received, asking the trainer to checkpoint"; kill -USR1 "$TRAINER" 2>/dev/null; }
trap 'REQUEUE_WANTED=1; notice USR1' USR1
trap 'notice TERM' TERM
while true; do
  wait "$TRAINER"; STATUS=$?
  kill -0 "$TRAINER" 2>/dev/null || break  # wait was interrupted by a signal, not the exit
done
kill "$WATCHDOG" 2>/dev/null; wait "$WATCHDOG"; WATCHED=$?
if [ "$WATCHED" -eq 79 ]; then STATUS=79; fi  # the watchdog killed a hung trainer
if [ "$STATUS" -eq 75 ] && [ "$REQUEUE_WANTED" -eq 1 ]; then
  echo "idmctl: trainer checkpointed and asked to be requeued"
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    # A preempted job that exits by itself ends COMPLETED or FAILED, never requeued (Slurm 22.05): requeue ourselves.
    if scontrol requeue "$SLURM_JOB_ID"; then sleep 60; else
      # A cluster whose preemption cancels may refuse it: sync resubmits the chain (taxonomy: preempted).
      echo "idmctl: requeue refused by the cluster: sync resubmits the chain"
    fi
  fi
fi
echo "idmctl: trainer exited $STATUS at $(date -Is)"
exit "$STATUS"
