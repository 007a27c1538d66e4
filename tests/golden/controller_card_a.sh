#!/bin/bash
#SBATCH --job-name=idmctl-controller-7
#SBATCH --qos=share
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=512M
#SBATCH --time=0-00:05:00
#SBATCH --dependency=afterany:6108
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --output=/home/operator/idmctl/runs/latent_c_n4/7/controller-%j.out
#SBATCH --open-mode=append
#SBATCH --no-requeue
# idmctl controller: once job 6108 (attempt 2 of chain 7) has ended, sync that chain:
# classify, record, exclude nodes, resubmit (the next attempt gets its own controller). Our own code on one
# CPU for seconds: no preflight, no stage-in. The store's URL (IDMCTL_DB_URL, which may hold a password)
# reaches this job only through sbatch's environment export (--export=ALL, Slurm's default), never this file.
set -uo pipefail
export IDMCTL_HOME=/home/operator/idmctl
export IDMCTL_CLUSTER=/opt/idmctl/src/clusters/card.yaml
export IDMCTL_CONTROLLER='{"attempt":2,"run_dir":"/home/operator/idmctl/runs/latent_c_n4/7","follow_up":0,"origin":null,"label":null}'
export PYTHONUNBUFFERED=1
cd /opt/idmctl/src || exit 1
echo "idmctl: controller ${SLURM_JOB_ID:-local} for chain 7 after job 6108 on $(hostname) at $(date -Is)"
# An sbatch from inside a job hands the job's own allocation (SLURM_CPUS_PER_TASK=1, SLURM_MEM_PER_NODE, …)
# to the attempt it resubmits: keep only the cluster's config, and this job's id under our own name.
export IDMCTL_CONTROLLER_JOB_ID="${SLURM_JOB_ID:-}"
for name in $(compgen -e | grep '^SLURM_' | grep -vx 'SLURM_CONF'); do unset "$name"; done
/opt/idmctl/venv/bin/python -m idmctl sync --chain 7 --controller-for 6108
STATUS=$?
echo "idmctl: controller exited $STATUS at $(date -Is)"
exit "$STATUS"
