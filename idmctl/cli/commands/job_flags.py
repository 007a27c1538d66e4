"""The job flags ``submit`` and ``preflight`` share: the same words describe the same effective job."""

from __future__ import annotations

from typing import Annotated

import typer

from ground.errors import UserError
from ground.units import SLURM_MEM_HELP
from idmctl.core.job_options import JobRequest, parse_gres

Qos = Annotated[str | None, typer.Option("--qos", help="QoS tier (default resources.qos).")]
Gres = Annotated[str | None, typer.Option("--gres", help="gpu:N per node (default resources.gpus_per_node).")]
Cpus = Annotated[int | None, typer.Option("-c", "--cpus", help="CPUs per node (default resources.cpus).")]
Mem = Annotated[str | None, typer.Option("--mem", help=f"Memory per node, e.g. 1600GB (default resources.mem). {SLURM_MEM_HELP}.")]
Exclude = Annotated[str | None, typer.Option("--exclude", help="Comma-separated nodes to avoid.")]
JobName = Annotated[str | None, typer.Option("-J", "--job-name", help="Job name (default the experiment).")]
Time = Annotated[str | None, typer.Option("--time", help="Time limit, Slurm format (default resources.time_limit).")]
Retries = Annotated[int | None, typer.Option("--retries", help="Resubmissions for retryable causes (default resources.retries).")]
Build = Annotated[str | None, typer.Option("--build", help="A cache build job instead of training: hidden, rgb, pt or ff.")]
Entry = Annotated[str | None, typer.Option("--entry", help="Python module the job runs (default trainers.train).")]
Account = Annotated[str | None, typer.Option("-A", "--account", help="Slurm account charged (default resources.account, else the cluster profile's).")]
Partition = Annotated[str | None, typer.Option("-p", "--partition", help="Partition (default resources.partition, else the QoS tier's or the profile's).")]
Constraint = Annotated[str | None, typer.Option("-C", "--constraint", help="Node features the job needs, e.g. the GPU type h100 (default resources.constraint).")]
Reservation = Annotated[str | None, typer.Option("--reservation", help="Reservation to run in (default resources.reservation).")]
GpusPerNode = Annotated[int | None, typer.Option("--gpus-per-node", min=0, max=999, help="GPUs per node: the same as --gres gpu:N (one of the two).")]


def flags(qos: str | None, gres: str | None, cpus: int | None, mem: str | None, exclude: str | None,
          job_name: str | None, time_limit: str | None, retries: int | None, entry: str | None,
          build: str | None = None, hold: bool | None = None, *, account: str | None = None,
          partition: str | None = None, constraint: str | None = None, reservation: str | None = None,
          gpus_per_node: int | None = None) -> JobRequest:
    """The flags as one typed request (None = not given): ``--gres gpu:N`` (or ``--gpus-per-node N``) becomes
    N, ``--exclude a,b`` a tuple. A malformed ``--gres``, or both GPU flags, is bad input here, before any
    spec is read."""
    gpus = parse_gres(gres) if gres is not None else None
    if gpus is not None and gpus_per_node is not None and gpus != gpus_per_node:
        raise UserError(f"--gres gpu:{gpus} and --gpus-per-node {gpus_per_node} disagree", file="command line",
                        field="--gpus-per-node", hint="give one of the two")
    return JobRequest(qos=qos, gpus_per_node=gpus if gpus is not None else gpus_per_node, cpus_per_node=cpus, mem=mem,
                      job_name=job_name, time_limit=time_limit, retries=retries, entry=entry, build=build, hold=bool(hold),
                      exclude=tuple(n for n in exclude.split(",") if n) if exclude is not None else None,
                      account=account, partition=partition, constraint=constraint, reservation=reservation)
