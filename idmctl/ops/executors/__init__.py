"""Executors run a rendered batch script: Slurm (sbatch) or a local subprocess, with the same records."""

from __future__ import annotations

from idmctl.core.executor import Executor, JobStatus


def executor_for(scheduler: str) -> Executor:
    """The executor a cluster profile's ``scheduler`` names."""
    if scheduler == "slurm":
        from idmctl.ops.executors.slurm import SlurmExecutor  # start-up: only the command that runs loads its module

        return SlurmExecutor()
    if scheduler == "local":
        from idmctl.ops.executors.local import LocalExecutor  # start-up: only the command that runs loads its module

        return LocalExecutor()
    from ground.errors import UserError  # start-up: only the command that runs loads its module

    raise UserError(f"unknown scheduler {scheduler!r}", field="scheduler", hint="use slurm or local")


__all__ = ["Executor", "JobStatus", "executor_for"]
