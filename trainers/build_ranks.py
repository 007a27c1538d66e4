"""A cache builder as one process per device: its rank, device, CPU threads, precision, the two
collectives a build needs (a barrier; rank 0's value to every rank), and the command that starts them.

- Rank, world and local rank come from srun's or torchrun's variables (``ground.ranks``).
- Device: ``cuda:LOCAL_RANK`` when CUDA works (an srun task sees every GPU the node's ``--gres``
  gave the job, so the local rank picks its own), else the CPU.
- Precision: bf16 autocast on CUDA; fp32 on the CPU, so a CPU build is bitwise reproducible for any
  number of ranks (tests/trainers/test_build_ranks.py). Every file records which (``precision``).
- Threads: the allocation's CPUs for this rank (``ground.ranks.cpu_threads``), never a fixed 1.
- Collectives over gloo (tiny: a barrier and one small object), whether the ranks run on GPUs or not:
  the rendezvous is ``MASTER_ADDR``/``MASTER_PORT``, set by :func:`builder_command`'s launcher.

Sharding is the builder's: item ``k`` of its deterministic work list (demos in name order, or
(demo, start) windows in the dataset's order) goes to rank ``k mod world``, so every file has exactly
one writer, and a rerun with any world size skips the files that exist.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ground.ranks import Ranks, cpu_threads, ranks_from_env

BARRIER_TIMEOUT = timedelta(hours=2)
"""Rank 0 computes the PT norm statistics over every demo while the others wait at a barrier."""


@dataclass
class BuildRank:
    ranks: Ranks
    device: Any
    """``torch.device`` this rank encodes on."""
    threads: int

    @property
    def precision(self) -> str:
        return "bf16-autocast" if self.device.type == "cuda" else "fp32"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def barrier(self) -> None:
        if self.ranks.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a small picklable object)."""
        if self.ranks.world == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.ranks.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


RANK_LINE_KEY = "rank_of_build"
"""First key of the one JSON line each builder rank prints when done (the job log's evidence per rank)."""


def rank_line(rank: BuildRank, **counts: Any) -> str:
    """``{"rank_of_build": R, "world", "local_rank", "launcher", "node", "device", "threads", **counts}``."""
    import json

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return json.dumps({RANK_LINE_KEY: rank.ranks.rank, "world": rank.ranks.world, "local_rank": rank.ranks.local_rank,
                       "launcher": rank.ranks.launcher, "node": node, "device": str(rank.device),
                       "threads": rank.threads, **counts})


def local_device(local_rank: int = 0) -> Any:
    """``cuda:local_rank`` when CUDA works here, else the CPU (the local cluster's fake GPUs are the CPU)."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def start_rank(env: Mapping[str, str] | None = None) -> BuildRank:
    """This process's rank: threads set, device chosen, the process group joined when there are several."""
    import torch

    env = os.environ if env is None else env
    ranks = ranks_from_env(env)
    threads = cpu_threads(ranks, env)
    torch.set_num_threads(threads)
    device = local_device(ranks.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if ranks.world > 1:
        import torch.distributed as dist

        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
        if missing:
            from ground.errors import UserError

            raise UserError(f"{ranks.world} ranks but no {' or '.join(missing)} to meet at", field="environment",
                            hint="start the builder with `python -m trainers.build_job` or torchrun, which set them")
        dist.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world, timeout=BARRIER_TIMEOUT)
    return BuildRank(ranks, device, threads)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def in_slurm_batch(env: Mapping[str, str]) -> bool:
    """The batch script of a Slurm job (not one of its srun tasks): srun can start the ranks."""
    return bool(env.get("SLURM_JOB_ID")) and "SLURM_STEP_ID" not in env


def builder_command(module_args: list[str], processes: int, port: int | None = None,
                    env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, env) starting ``python -m <module_args>`` as ``processes`` ranks.

    In a Slurm batch script: one srun task per rank over the allocation (``--ntasks=processes``, each
    with the job's ``--cpus-per-task``; srun spreads them over the nodes as the job's
    ``--ntasks-per-node`` says); rank 0 runs on this, the first, node, which hosts the rendezvous.
    Elsewhere: torchrun with ``processes`` workers on this host, or a plain process for one."""
    env = dict(os.environ if env is None else env)
    python = [sys.executable, "-m", *module_args]
    env["MASTER_PORT"] = str(port if port is not None else free_port())
    if in_slurm_batch(env):
        env["MASTER_ADDR"] = socket.gethostname()
        cpus = env.get("SLURM_CPUS_PER_TASK", "")
        # srun does not inherit sbatch's --cpus-per-task (Slurm ≥ 22.05): pass it on, or each task gets 1 CPU.
        srun = ["srun", "--kill-on-bad-exit=1", f"--ntasks={processes}", *([f"--cpus-per-task={cpus}"] if cpus else [])]
        return [*srun, *python], env
    if processes == 1:
        return python, env
    env["MASTER_ADDR"] = "127.0.0.1"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={processes}",
                "--master-addr=127.0.0.1", f"--master-port={env['MASTER_PORT']}"]
    return [*torchrun, "-m", *module_args], env


@contextlib.contextmanager
def build_rank(env: Mapping[str, str] | None = None) -> Iterator[BuildRank]:
    rank = start_rank(env)
    try:
        yield rank
    finally:
        rank.close()
