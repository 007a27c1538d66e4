#!/bin/bash
#SBATCH --job-name=latent_c_n4-eval-60000
#SBATCH --qos=core-own
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=14
#SBATCH --mem=200G
#SBATCH --gres=gpu:1
#SBATCH --time=30-00:00:00
#SBATCH --exclude=worker-5
#SBATCH --output=/home/operator/idmctl/runs/latent_c_n4/7/eval-step-60000-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@61
#SBATCH --dependency=afterok:4242
#SBATCH --kill-on-invalid-dep=yes
# idmctl: eval job: 1 process, 1 GPU; CPUs 112 ÷ 8 ranks = 14; memory 1600G ÷ 8 ranks = 200G (one training rank's share); time limit 30-00:00:00 (the training job's: evaluator time unmeasured, no eval job of this spec ran yet)
set -uo pipefail
export IDMCTL_HOME=/home/operator/idmctl
export IDMCTL_CHAIN_ID=8
export IDMCTL_ATTEMPT=1
export IDMCTL_SPEC_HASH=9f2e7784b5ca32c1082f53434fdf59efb4c72957457114d99532f5aeb28f4503
export PYTHONUNBUFFERED=1
export IDMCTL_RUN_DIR=/home/operator/idmctl/runs/latent_c_n4/7
export IDMCTL_PYTHON=/opt/idmctl/venv/bin/python
export SRUN_CPUS_PER_TASK=14
export IDMCTL_CODE_VERSION=0123456789abcdef0123456789abcdef01234567
export IDMCTL_SNAPSHOT=/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567
export IDMCTL_CODE_STORE=/home/operator/idmctl/code
export IDMCTL_ENV_DIGEST=eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
RUN_DIR=/home/operator/idmctl/runs/latent_c_n4/7
cd /home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567 || exit 1
echo "idmctl: job ${SLURM_JOB_ID:-local} chain $IDMCTL_CHAIN_ID attempt $IDMCTL_ATTEMPT restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"
# code: snapshot 0123456789abcdef0123456789abcdef01234567, the code the gate admitted; every attempt of the chain runs it.
export PYTHONPATH=/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567"${PYTHONPATH:+:$PYTHONPATH}"
/opt/idmctl/venv/bin/python -m ground.code_snapshot verify || exit $?

# node guard: /dev/shm free vs the loader's 0 B (stale segments of dead jobs are the evidence),
# scratch vs stage-in bytes, the 1 GPUs requested visible, the cache mounted; before stage-in and training.
node_guard() {
  if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
      /opt/idmctl/venv/bin/python -m trainers.node_guard --shm-need 0 --gpus 1 --phase "$@"
  else
    /opt/idmctl/venv/bin/python -m trainers.node_guard --shm-need 0 --gpus 1 --phase "$@"
  fi
  local status=$?
  if [ "$status" -ne 0 ]; then
    echo "idmctl: node guard ($1) failed with exit $status at $(date -Is): ending the job before it runs"
    exit "$status"
  fi
}
node_guard stage --cache-root /nas/cache/cosmos_hidden_multi

# stage-in: none (an eval job reads only its held-out episodes' files, in place under data.cache_root:
# copying the whole cache to the node to score one checkpoint would move every training file too)
node_guard train

# Ranks: srun under Slurm (launch single: one process);
# the local executor runs the same script without srun. srun gets --cpus-per-task itself: since Slurm 22.05
# it does not inherit it from sbatch, and each task would be confined to one CPU.
if [ -n "${SLURM_JOB_ID:-}" ]; then LAUNCH=(srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=14); else LAUNCH=(); fi
# An evaluation of one checkpoint: loads checkpoints/step-60000, resumes nothing, logs into the chain's MLflow run.
/opt/idmctl/venv/bin/python -m trainers.eval_job --run-dir "$RUN_DIR" --step 60000 &
TRAINER=$!
# The hang watchdog: stacks of every rank, then kill, when the heartbeat stops (trainers/watchdog.py).
/opt/idmctl/venv/bin/python -m trainers.watchdog --run-dir "$RUN_DIR" --trainer-pid "$TRAINER" --k 10 --floor 600 --poll 30 --start-deadline 300 &
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
