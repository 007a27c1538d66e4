"""Which rank this process is, from whichever launcher started it; and how many CPU threads it may use.

Two launchers start builders (and trainers) as one process per device:

- Slurm's ``srun``: ``SLURM_PROCID`` (global rank), ``SLURM_NTASKS`` (world), ``SLURM_LOCALID`` (rank
  on this node), ``SLURM_NTASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (ranks on this node);
- ``torchrun`` (and ``accelerate launch``, which runs torchrun): ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``.

torchrun's variables win when both are present: a torchrun inside an srun task sets its own, and its
ranks are the processes that exist. A batch script's own shell has ``SLURM_PROCID=0`` and
``SLURM_NTASKS`` too (job 1349 on the local cluster), but no ``SLURM_STEP_ID``: only an srun task has
that, so the batch shell reads as one plain process.

No torch here: the ground imports nothing heavy (tests/test_architecture.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ground.errors import UserError


@dataclass(frozen=True)
class Ranks:
    """This process's place among the processes of one launch."""

    rank: int
    world: int
    local_rank: int
    """Index among the ranks on this node: the CUDA device it uses (``cuda:local_rank``)."""
    local_world: int
    """Ranks on this node: they share its CPUs."""
    launcher: str
    """``srun``, ``torchrun`` or ``single`` (a plain process)."""


SINGLE = Ranks(rank=0, world=1, local_rank=0, local_world=1, launcher="single")


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    if not re.fullmatch(r"\d+", value.strip()):
        raise UserError(f"{name}={value!r} is not a whole number", field=name,
                        hint="start the ranks with srun or torchrun, which set it")
    return int(value)


def _slurm_tasks_on_this_node(env: Mapping[str, str], world: int) -> int:
    """``SLURM_TASKS_PER_NODE`` is per node, compressed (``2(x3),1``): this node's entry by SLURM_NODEID."""
    if "SLURM_STEP_TASKS_PER_NODE" in env or "SLURM_TASKS_PER_NODE" in env:
        text = env.get("SLURM_STEP_TASKS_PER_NODE") or env["SLURM_TASKS_PER_NODE"]
        counts: list[int] = []
        for part in text.split(","):
            match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
            if match is None:
                return world
            counts += [int(match.group(1))] * int(match.group(2) or 1)
        node = int(env.get("SLURM_NODEID", "0") or 0)
        return counts[node] if node < len(counts) else counts[-1]
    return world


def ranks_from_env(env: Mapping[str, str] | None = None) -> Ranks:
    """Rank, world size and local rank from torchrun's or srun's variables; one plain process without either."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env or "RANK" in env:
        world, rank = _int(env, "WORLD_SIZE"), _int(env, "RANK")
        local_rank = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        ranks = Ranks(rank, world, local_rank, local_world, "torchrun")
    elif "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        world, rank = _int(env, "SLURM_NTASKS"), _int(env, "SLURM_PROCID")
        local_rank = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        ranks = Ranks(rank, world, local_rank, _slurm_tasks_on_this_node(env, world), "srun")
    else:
        return SINGLE
    if not (0 <= ranks.rank < ranks.world and 0 <= ranks.local_rank < ranks.local_world <= ranks.world):
        raise UserError(f"{ranks.launcher} says rank {ranks.rank} of {ranks.world}, local rank "
                        f"{ranks.local_rank} of {ranks.local_world}: not a valid place", field="environment",
                        hint="start the ranks with srun or torchrun, not by setting the variables by hand")
    return ranks


def cpu_threads(ranks: Ranks, env: Mapping[str, str] | None = None, available: int | None = None) -> int:
    """CPU threads for one rank: ``SLURM_CPUS_PER_TASK`` under Slurm (each task's share), else the CPUs
    this process may run on (``os.sched_getaffinity``) divided among the ranks on this node; at least 1."""
    env = os.environ if env is None else env
    if available is None:
        available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_task = env.get("SLURM_CPUS_PER_TASK", "")
    if ranks.launcher == "srun" and per_task.isdigit() and int(per_task) > 0:
        return max(1, min(int(per_task), available))
    return max(1, available // ranks.local_world)
