"""The job flags ``submit`` and ``preflight`` share: the same words describe the same effective job."""

from __future__ import annotations

from typing import Annotated

import typer

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


def flags(qos: str | None, gres: str | None, cpus: int | None, mem: str | None, exclude: str | None,
          job_name: str | None, time_limit: str | None, retries: int | None, entry: str | None,
          build: str | None = None, hold: bool | None = None) -> JobRequest:
    """The flags as one typed request (None = not given): ``--gres gpu:N`` becomes N, ``--exclude a,b`` a tuple.
    A malformed ``--gres`` is bad input here, before any spec is read."""
    return JobRequest(qos=qos, gpus_per_node=parse_gres(gres) if gres is not None else None, cpus_per_node=cpus, mem=mem,
                      job_name=job_name, time_limit=time_limit, retries=retries, entry=entry, build=build, hold=bool(hold),
                      exclude=tuple(n for n in exclude.split(",") if n) if exclude is not None else None)
