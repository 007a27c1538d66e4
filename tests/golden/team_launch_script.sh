#!/bin/bash
#SBATCH --job-name=team_n4
#SBATCH --qos=core-own
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=2G
#SBATCH --time=0-00:10:00
#SBATCH --output=/home/operator/idmctl/runs/team_n4/1/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@60
# idmctl: step time 0.0041 ms/step (data-bound lower bound; compute unmeasured (no CPU smoke); estimate: storage 0.0041 ms + loader CPU unmeasured + compute unmeasured (not overlapped: num_workers 0 with a team's own dataset class loads on the step's own thread) = 0.0041 ms/step, bound by storage); checkpoint write unknown (no smoke or earlier run measured one)
# idmctl: time limit = 0-00:10:00 (from resources.time_limit 0:10:00); derived would be: (8 steps × 0.0041 ms/step) × 1.25 margin = 0.0 s, at least 30.0 min for start-up and evaluation → 0-00:30:00 (a lower bound: the step time holds no compute)
# idmctl: checkpoint interval = 4 steps (from train.checkpoint_every 4); derived would be: non-preemptible core-own: lose at most 4.0 h to a failure → interval ≤ 4.0 h; 4.0 h ÷ 0.0041 ms/step = 8 steps (the whole run)
# idmctl: signal lead = 60 s (derived): (0.0041 ms step + unmeasured write) × 3 = 0.0123 ms, at least 60 s (Slurm's timer) → 60.0 s
set -uo pipefail
export IDMCTL_HOME=/home/operator/idmctl
export IDMCTL_CHAIN_ID=1
export IDMCTL_ATTEMPT=1
export IDMCTL_SPEC_HASH=a9df9d3cbff9488bedcd7f17226ab6d2ca37ac500e703c8887fdba5cb63c74b1
export PYTHONUNBUFFERED=1
export IDMCTL_RUN_DIR=/home/operator/idmctl/runs/team_n4/1
export IDMCTL_PYTHON=/opt/idmctl/venv/bin/python
export SRUN_CPUS_PER_TASK=1
export IDMCTL_CODE_VERSION=0123456789abcdef0123456789abcdef01234567
export IDMCTL_SNAPSHOT=/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567
export IDMCTL_CODE_STORE=/home/operator/idmctl/code
export IDMCTL_ENV_DIGEST=eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
export IDMCTL_CODE_ROOTS=/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567/examples/team_repo
RUN_DIR=/home/operator/idmctl/runs/team_n4/1
cd /home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567 || exit 1
echo "idmctl: job ${SLURM_JOB_ID:-local} chain $IDMCTL_CHAIN_ID attempt $IDMCTL_ATTEMPT restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"
# code: snapshot 0123456789abcdef0123456789abcdef01234567, the code the gate admitted; every attempt of the chain runs it.
export PYTHONPATH=/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567:/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567/examples/team_repo"${PYTHONPATH:+:$PYTHONPATH}"
/opt/idmctl/venv/bin/python -m ground.code_snapshot verify || exit $?

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
node_guard stage

# stage-in: disabled (stage.enabled: false); the trainer reads data.cache_root in place
node_guard train

# Ranks: srun under Slurm (launch per_rank: one task per rank, Fabric reads SLURM_* and needs ntasks-per-node == devices);
# the local executor runs the same script without srun. srun gets --cpus-per-task itself: since Slurm 22.05
# it does not inherit it from sbatch, and each task would be confined to one CPU.
if [ -n "${SLURM_JOB_ID:-}" ]; then LAUNCH=(srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=1); else LAUNCH=(); fi
# entry: bash scripts/run_idm_train_robocasa_latent_C_layer_routed_n4.sh (the entry contract: IDMCTL_RUN_DIR, one IDMCTL_STEP line per step)
(cd /home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567/examples/team_repo && exec "${LAUNCH[@]}" bash scripts/run_idm_train_robocasa_latent_C_layer_routed_n4.sh) &
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
