#!/bin/bash
#SBATCH --job-name=latent_c_n4_2node
#SBATCH --qos=core-extra
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=14
#SBATCH --mem=1600G
#SBATCH --gres=gpu:8
#SBATCH --time=30-00:00:00
#SBATCH --exclude=worker-5
#SBATCH --output=/home/operator/idmctl/runs/latent_c_n4_2node/1/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@60
# idmctl: step time 10.1 s/step (data-bound lower bound; compute unmeasured (no GPU smoke); estimate: max(storage 10.1 s, loader CPU unmeasured, compute unmeasured) + 0 s not overlapped (num_workers 0: the rank's batch loader reads 2 batches ahead on threads) = 10.1 s/step, bound by storage); checkpoint write unknown (no smoke or earlier run measured one)
# idmctl: time limit = 30-00:00:00 (from resources.time_limit 30-00:00:00); derived would be: (stage-in 4.4 h + 60,000 steps × 10.1 s/step + cold page cache 2.0 min) × 1.25 margin = 9.0 d → 9-00:40:00 (a lower bound: the step time holds no compute)
# idmctl: checkpoint interval = 500 steps (from train.checkpoint_every 500); derived would be: non-preemptible core-extra: lose at most 4.0 h to a failure → interval ≤ 4.0 h; 4.0 h ÷ 10.1 s/step = 1,421 steps
# idmctl: signal lead = 60 s (derived): (10.1 s step + unmeasured write) × 3 = 30.4 s, at least 60 s (Slurm's timer) → 60.0 s
# idmctl: resources.time_limit 30-00:00:00 asks for 30.0 d, 3.3× the derived 9.0 d: a longer queue wait and a hung job found late
set -uo pipefail
export IDMCTL_HOME=/home/operator/idmctl
export IDMCTL_CHAIN_ID=1
export IDMCTL_ATTEMPT=1
export IDMCTL_SPEC_HASH=39bc18d7283b4b8a74236996f795257982a97f439ca2a728589f20f5beac82cf
export PYTHONUNBUFFERED=1
export IDMCTL_RUN_DIR=/home/operator/idmctl/runs/latent_c_n4_2node/1
export IDMCTL_PYTHON=/opt/idmctl/venv/bin/python
export SRUN_CPUS_PER_TASK=14
export IDMCTL_CODE_VERSION=0123456789abcdef0123456789abcdef01234567
export IDMCTL_SNAPSHOT=/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567
export IDMCTL_CODE_STORE=/home/operator/idmctl/code
export IDMCTL_ENV_DIGEST=eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
RUN_DIR=/home/operator/idmctl/runs/latent_c_n4_2node/1
cd /home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567 || exit 1
echo "idmctl: job ${SLURM_JOB_ID:-local} chain $IDMCTL_CHAIN_ID attempt $IDMCTL_ATTEMPT restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"
# code: snapshot 0123456789abcdef0123456789abcdef01234567, the code the gate admitted; every attempt of the chain runs it.
export PYTHONPATH=/home/operator/idmctl/code/0123456789abcdef0123456789abcdef01234567"${PYTHONPATH:+:$PYTHONPATH}"
/opt/idmctl/venv/bin/python -m ground.code_snapshot verify || exit $?

# node guard: /dev/shm free vs the loader's 0 B (stale segments of dead jobs are the evidence),
# scratch vs stage-in bytes, the 8 GPUs requested visible, the cache mounted; before stage-in and training.
node_guard() {
  if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
      /opt/idmctl/venv/bin/python -m trainers.node_guard --shm-need 0 --gpus 8 --phase "$@"
  else
    /opt/idmctl/venv/bin/python -m trainers.node_guard --shm-need 0 --gpus 8 --phase "$@"
  fi
  local status=$?
  if [ "$status" -ne 0 ]; then
    echo "idmctl: node guard ($1) failed with exit $status at $(date -Is): ending the job before it runs"
    exit "$status"
  fi
}
node_guard stage --cache-root /nas/cache/cosmos_hidden_multi --stage-dest /tmp/idm_cache --stage-bytes 7151073361920 --stage-layers all --stage-model 'legacy_pt blocks=2,5,8,11,14,17,20,23,26,29,32,35 T=24 grid=27x48 C=5120 bfloat16 vae=- transformer=-'

# stage-in: copy the cache to each node's local disk once. The marker records what the copy is
# (source, layer set, model identity, files: ground/stage.py); a copy of another key is replaced.
export STAGE_SRC=/nas/cache/cosmos_hidden_multi
export STAGE_DEST=/tmp/idm_cache
export STAGE_LAYERS=all
export STAGE_MODEL='legacy_pt blocks=2,5,8,11,14,17,20,23,26,29,32,35 T=24 grid=27x48 C=5120 bfloat16 vae=- transformer=-'
export RUN_DIR
# This job uses the copy for its whole life: a shared flock on its own file under DEST.users, held by this
# shell's fd 8 until the job ends. A stage-in that would replace the copy waits for such jobs, then fails naming them.
export STAGE_ME="${SLURM_JOB_ID:-${IDMCTL_LOCAL_JOB_ID:-$$}}"
mkdir -p "$STAGE_DEST.users" && exec 8>"$STAGE_DEST.users/$STAGE_ME" && flock -s 8 || {
  echo "idmctl: stage-in FAILED: cannot hold $STAGE_DEST.users/$STAGE_ME"; exit 1; }
stage_in() (  # a subshell: the copy lock is released when the copy ends, not held by the trainer
  node="${SLURMD_NODENAME:-$(hostname)}"
  mkdir -p "$(dirname "$STAGE_DEST")" || exit 1
  exec 9>"$STAGE_DEST.lock" && flock 9
  err="$RUN_DIR/stage-$node.err"
  plan="$(/opt/idmctl/venv/bin/python -m ground.stage prepare --source "$STAGE_SRC" --dest "$STAGE_DEST" --layers "$STAGE_LAYERS" --model "$STAGE_MODEL" --me "$STAGE_ME" --wait 120 2>"$err")" || {
    echo "idmctl: stage-in FAILED (ground.stage exit $?): $(tail -n 1 "$err")"; exit 1; }
  case "${plan%%$'\t'*}" in
    staged) echo "idmctl: stage-in skipped on $node: $STAGE_DEST already holds ${plan#*$'\t'}"; exit 0 ;;
    replace) echo "idmctl: stage-in on $node replaces the copy at $STAGE_DEST: ${plan#*$'\t'}" ;;
    resume) echo "idmctl: stage-in on $node resumes the unfinished copy at $STAGE_DEST" ;;
  esac
  echo "idmctl: stage-in on $node $STAGE_SRC -> $STAGE_DEST ($(du -sb "$STAGE_SRC" | cut -f1) bytes)"
  cp -a "$STAGE_SRC/." "$STAGE_DEST/" 2>"$err"
  status=$?
  if [ "$status" -ne 0 ]; then
    echo "idmctl: stage-in FAILED (cp exit $status): $(tail -n 1 "$err"); free on $STAGE_DEST: $(df -B1 --output=avail "$STAGE_DEST" | tail -n 1) bytes"
    exit 1
  fi
  /opt/idmctl/venv/bin/python -m ground.stage commit --dest "$STAGE_DEST" 2>"$err" || {
    echo "idmctl: stage-in FAILED (ground.stage commit exit $?): $(tail -n 1 "$err")"; exit 1; }
  echo "idmctl: stage-in done on $node"
)
if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
  srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
    bash -c "$(declare -f stage_in); stage_in" || exit 1
else
  stage_in || exit 1
fi
export IDMCTL_CACHE_ROOT="$STAGE_DEST"
node_guard train

# Ranks: srun under Slurm (launch per_rank: one task per rank, Fabric reads SLURM_* and needs ntasks-per-node == devices);
# the local executor runs the same script without srun. srun gets --cpus-per-task itself: since Slurm 22.05
# it does not inherit it from sbatch, and each task would be confined to one CPU.
# 2 nodes × 8 tasks: world 16; rank 0's host is the allocation's first node.
if [ -n "${SLURM_JOB_ID:-}" ]; then
  export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
  export MASTER_PORT="$((15000 + SLURM_JOB_ID % 10000))"  # Fabric: job id's last 4 digits + 15000
  echo "idmctl: $SLURM_JOB_NUM_NODES nodes ($SLURM_JOB_NODELIST), rendezvous $MASTER_ADDR:$MASTER_PORT"
fi
if [ -n "${SLURM_JOB_ID:-}" ]; then LAUNCH=(srun --kill-on-bad-exit=1 --ntasks-per-node=8 --cpus-per-task=14); else LAUNCH=(); fi
"${LAUNCH[@]}" /opt/idmctl/venv/bin/python -m trainers.train --run-dir "$RUN_DIR" &
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
