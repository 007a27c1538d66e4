"""A job's options as typed values: what the command line asks (:class:`JobRequest`) and what the job
then asks the scheduler for (:class:`JobOptions`, the spec's defaults after the request overrode them).

The CLI turns its flags into a :class:`JobRequest` once; the library reads fields, never flag spellings.
The spellings (``--qos``, ``-c``) are each field's metadata: they name a flag in messages and key what
the store keeps (``Job.admitted``'s ``flags``, the preflight gate's ``smoke_flags``), whose on-disk
form is unchanged, so rows written before this module read as they always did.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ground import contract
from ground.errors import UserError
from ground.units import parse_duration, parse_slurm_mem

_GRES = re.compile(r"^gpu:(\d{1,3})$")


def _flag(spelling: str, resource: str | None = None) -> Any:
    """A request field: not given (None) by default; ``spelling`` is its command-line flag, ``resource``
    the ``resources`` field of the spec it overrides (the effective spec carries the value)."""
    return field(default=None, metadata={"flag": spelling, "resource": resource})


@dataclass(frozen=True)
class JobRequest:
    """The job flags ``submit`` and ``preflight`` share, typed; None: not given, the spec decides."""

    qos: str | None = _flag("--qos", "qos")
    """The QoS tier (the spec's ``resources.qos``)."""
    time_limit: str | None = _flag("--time", "time_limit")
    """Wall-clock limit in Slurm's format (``resources.time_limit``)."""
    mem: str | None = _flag("--mem", "mem")
    """Memory per node as written, e.g. ``1600GB`` (``resources.mem``)."""
    cpus_per_node: int | None = _flag("-c", "cpus")
    """CPUs per node (``resources.cpus``)."""
    gpus_per_node: int | None = _flag("--gres", "gpus_per_node")
    """GPUs per node, from ``--gres gpu:N`` (or ``--gpus-per-node N``); 0 asks for none."""
    account: str | None = _flag("--account", "account")
    """The Slurm account charged (``resources.account``, else the profile's)."""
    partition: str | None = _flag("--partition", "partition")
    """The partition (``resources.partition``, else the QoS tier's, else the profile's)."""
    constraint: str | None = _flag("--constraint", "constraint")
    """Node features the job needs, e.g. the GPU type (``resources.constraint``, else the profile's)."""
    reservation: str | None = _flag("--reservation", "reservation")
    """A reservation to run in (``resources.reservation``, else the profile's)."""
    job_name: str | None = _flag("-J")
    """The Slurm job name (default: the spec's ``resources.job_name`` or the experiment)."""
    exclude: tuple[str, ...] | None = _flag("--exclude")
    """Nodes to avoid; replaces ``resources.exclude`` (active node exclusions are merged in later)."""
    retries: int | None = _flag("--retries")
    """Resubmissions allowed for retryable causes (``resources.retries``)."""
    entry: str | None = _flag("--entry")
    """The module or command line the job runs (``code.entry``, else trainers.train)."""
    build: str | None = _flag("--build")
    """A cache build job of this mode (``contract.BUILD_MODES``) instead of training."""
    hold: bool = field(default=False, metadata={"flag": "--hold", "resource": None})
    """Submitted held (``#SBATCH --hold``) until ``scontrol release``."""
    dependency: str | None = _flag("--dependency")
    """Slurm's ``--dependency`` (``afterok:123``): the job starts only once the jobs it names allow it."""
    kill_on_invalid_dep: bool = field(default=False, metadata={"flag": "--kill-on-invalid-dep", "resource": None})
    """``--kill-on-invalid-dep=yes``: Slurm cancels the job when its dependency can never be met (the job it
    waits on failed or was cancelled) instead of leaving it pending forever."""

    def is_given(self, name: str) -> bool:
        value = getattr(self, name)
        return value is not None and value is not False

    def given_fields(self) -> list[str]:
        """The names of the fields given, in field order."""
        return [f.name for f in fields(self) if self.is_given(f.name)]

    def given(self) -> dict[str, Any]:
        """The given flags keyed by spelling, as the store keeps them (``{"--gres": "gpu:4", "-c": 8}``)."""
        return {flag_of(name): _stored(name, getattr(self, name)) for name in self.given_fields()}

    @classmethod
    def from_given(cls, stored: dict[str, Any]) -> "JobRequest":
        """From :meth:`given`'s form (a job row's ``flags``); spellings it does not know are ignored."""
        by_flag = {flag_of(f.name): f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for spelling, value in stored.items():
            name = by_flag.get(spelling)
            if name is None or value is None:
                continue
            if name == "gpus_per_node" and isinstance(value, str):
                value = parse_gres(value)
            elif name == "exclude":
                value = tuple(value)
            values[name] = bool(value) if name in ("hold", "kill_on_invalid_dep") else value
        return cls(**values)


def flag_of(name: str) -> str:
    """``"gpus_per_node"`` → ``"--gres"``: the flag of a :class:`JobRequest` field."""
    return _FIELDS[name].metadata["flag"]


def resource_of(name: str) -> str | None:
    """The ``resources`` field a :class:`JobRequest` field overrides (None: a scheduling-only option)."""
    return _FIELDS[name].metadata["resource"]


_FIELDS = {f.name: f for f in fields(JobRequest)}
RESOURCE_FIELDS = tuple(name for name in _FIELDS if resource_of(name))
"""Request fields that change ``resources`` in the effective spec: every check and the trainer see them."""
SMOKE_FIELDS = ("gpus_per_node", "entry", "build")
"""Request fields that change what the smoke measured, so a preflight with the same values must have
passed: GPUs change the device and the world size (grad accumulation, DDP), the entry the code that runs,
a build makes it a cache build (the build preflight's 1-file encode). The others change only what the
static checks judge, and those run again on the effective job at every submit."""


def _stored(name: str, value: Any) -> Any:
    if name == "gpus_per_node":
        return f"gpu:{value}"
    if name == "exclude":
        return list(value)
    return value


def parse_gres(value: str) -> int:
    """``gpu:N`` → N; anything else is bad input naming ``--gres``."""
    match = _GRES.fullmatch(value)
    if not match:
        raise UserError(f"{value!r} is not gpu:N", file="--gres", hint="e.g. --gres gpu:8")
    return int(match.group(1))


@dataclass(frozen=True)
class JobOptions:
    """What one submission asks for: the spec's defaults after flags overrode them (stored in Job.options_json)."""

    job_name: str
    """``-J``; the spec's ``resources.job_name`` or the experiment name."""
    qos: str
    """``--qos``."""
    partition: str | None
    """``--partition``; None lets the cluster pick."""
    nodes: int
    """``--nodes``."""
    ranks_per_node: int
    """Ranks (processes of the training) per node: one per GPU, or ``cpu_ranks`` on CPU."""
    cpus_per_node: int
    """CPUs per node; each task gets ``cpus_per_node // tasks_per_node`` (at least 1)."""
    mem: str
    """Memory per node as written (e.g. ``4GB``), read as Slurm reads it (``ground.units.parse_slurm_mem``)."""
    gpus_per_node: int
    """``--gres=gpu:N``; 0 asks for none."""
    time_limit: str | None
    """Wall-clock limit as written; None until :func:`idmctl.job.derived.job_limits` derives it."""
    exclude: list[str] = field(default_factory=list)
    """Nodes to avoid (flag, spec, and active node exclusions)."""
    retries: int = 0
    """Resubmissions allowed for retryable causes."""
    entry: str = contract.DEFAULT_ENTRY
    """A Python module started with ``python -m ENTRY --run-dir RUN_DIR``, or a command line (the team's
    launch script) run from the snapshot's copy of the first code root (``--entry``, else ``code.entry``)."""
    hang_k: float = 10.0
    """The watchdog's k, floor and poll (the cluster profile's ``hang:``, kept so a resubmit uses the same)."""
    hang_floor_s: float = 600.0
    hang_poll_s: float = 30.0
    hang_start_s: float | None = None
    """The watchdog's start-up deadline (seconds to the first beat); None: none (a row of an older idmctl)."""
    signal_lead: int | None = None
    """Seconds of USR1 warning; derived from measured step + checkpoint write time (or the spec's)."""
    checkpoint_every: int | None = None
    """Derived steps between checkpoints, passed as IDMCTL_CHECKPOINT_EVERY when the spec sets none."""
    loader_direct: bool = False
    """The plan's read path (``Limits.loader_direct``): True passes IDMCTL_LOADER_DIRECT=1, the trainer's loader reads O_DIRECT."""
    derivation: list[str] = field(default_factory=list)
    """How the limits were derived, one line each: printed as comments at the top of the script."""
    hold: bool = False
    """``--hold``: submitted held (``#SBATCH --hold``) until ``scontrol release``; a resubmission is never held."""
    build: str | None = None
    """``--build MODE``: a cache build job (``contract.BUILD_ENTRY``) in the batch shell, starting one
    builder rank per srun task (``ranks_per_node`` per node, over ``nodes``); None for training."""
    dependency: str | None = None
    """``--dependency`` as Slurm writes it (``afterok:123``); an eval job waits on the training attempt."""
    kill_on_invalid_dep: bool = False
    """``--kill-on-invalid-dep=yes``: cancelled by Slurm when the dependency can never be met."""
    eval_step: int | None = None
    """An evaluation job of the checkpoint at this step (``contract.EVAL_ENTRY`` in the batch shell, one
    process): it loads the checkpoint, runs the spec's evaluations and logs into the training chain's
    MLflow run at this step; None for training."""
    account: str | None = None
    """``--account``: flag, spec, then the cluster profile's; None lets Slurm use the user's default."""
    constraint: str | None = None
    """``--constraint``: flag, spec, then the profile's (node features, e.g. the GPU type)."""
    reservation: str | None = None
    """``--reservation``: flag, spec, then the profile's."""
    launch: str = "per_rank"
    """How the entry starts (``ground.spec.schema.LAUNCH_MODES``): ``per_rank`` one srun task per rank,
    ``per_node`` one per node holding all its GPUs and CPUs (the entry starts its ranks), ``single`` one."""

    @property
    def tasks_per_node(self) -> int:
        """``--ntasks-per-node``: the ranks when srun starts them, one task when the entry starts its own."""
        return self.ranks_per_node if self.launch == "per_rank" else 1

    @property
    def cpus_per_task(self) -> int:
        """``--cpus-per-task`` of the allocation and of the training srun (which does not inherit it since 22.05)."""
        return max(1, self.cpus_per_node // self.tasks_per_node)

    @property
    def mem_mib(self) -> int:
        """MiB as Slurm reads ``mem`` (``1600GB`` → 1,638,400: Slurm's G is 1024 MiB)."""
        return math.ceil(parse_slurm_mem(self.mem) / 2**20)

    @property
    def time_seconds(self) -> float:
        if self.time_limit is None:
            raise UserError("no time limit: none in the spec or flags, and none derived", field="resources.time_limit",
                            hint="set resources.time_limit or pass --time")
        return parse_duration(self.time_limit)

    @property
    def signal_lead_s(self) -> int:
        """Seconds before the time limit the batch shell gets USR1 (Slurm may send it up to 60 s earlier):
        the derived lead when there is one, else 5% of the limit within [60 s, 600 s]."""
        if self.signal_lead is not None:
            return int(self.signal_lead)
        return int(min(600, max(60, self.time_seconds * 0.05)))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
