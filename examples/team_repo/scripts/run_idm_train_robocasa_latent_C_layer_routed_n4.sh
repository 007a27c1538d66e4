#!/usr/bin/env bash
# The team's N=4 layer-routed training entry (card A), as idmctl's spec names it in `code.entry`.
# IDMCTL_PYTHON: the interpreter to run (idmctl's job script sets it to the project's venv python);
#   unset, the `python` on PATH.
# IDMCTL_SMOKE_BATCH: set only by idmctl's smoke, the per-device batch for its few steps.
# Extra arguments pass through to team_idm.train (e.g. --max_steps 6 --save_steps 2).
set -euo pipefail
cd "$(dirname "$0")/.."
# num_workers 0 everywhere: with the N=12 cache, worker prefetch filled /dev/shm (job 5845, ENOSPC).
exec "${IDMCTL_PYTHON:-python}" -m team_idm.train \
    --config configs/base_latent_C_layer_routed_n4.yaml \
    --dataloader_num_workers 0 \
    --per_device_train_batch_size "${IDMCTL_SMOKE_BATCH:-2}" \
    --output_dir outputs/idm_robocasa_latent_C_n4 \
    "$@"
