#!/usr/bin/env bash
# The team's N=4 entry as 8-GPU launch scripts usually are: it starts its own ranks, one per GPU of the node
# it runs on, with torchrun (`python -m torch.distributed.run`). Its spec says `code.launch: per_node`, so
# idmctl's job starts it once per node holding all the node's GPUs and CPUs, and tells it how many ranks to
# start: IDMCTL_NPROC_PER_NODE and IDMCTL_NNODES (MASTER_ADDR/MASTER_PORT too on several nodes). The
# preflight's smoke runs it the same way with IDMCTL_NPROC_PER_NODE=1: one rank, one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${IDMCTL_PYTHON:-python}" -m torch.distributed.run \
    --nnodes "${IDMCTL_NNODES:-1}" --nproc_per_node "${IDMCTL_NPROC_PER_NODE:-8}" --node_rank "${SLURM_NODEID:-0}" \
    --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "${MASTER_PORT:-29500}" \
    -m team_idm.train \
    --config configs/base_latent_C_layer_routed_n4.yaml \
    --dataloader_num_workers 0 \
    --per_device_train_batch_size "${IDMCTL_SMOKE_BATCH:-2}" \
    --output_dir outputs/idm_robocasa_latent_C_n4 \
    "$@"
