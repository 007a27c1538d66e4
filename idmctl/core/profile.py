"""Cluster profiles: QoS tiers and node/storage facts, declared once in ``clusters/*.yaml``.

Preflight reads its limits from here (shm, scratch, bandwidth, preempt cycles, GPU caps), so the
numbers a check uses are the cluster's, not guesses in code. ``$IDMCTL_CLUSTER`` picks the profile
(a shipped name or a path); the default is ``local``.
"""

from __future__ import annotations

from typing import Literal

import difflib
import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ground.contract import ENV_CLUSTER
from ground.errors import UserError
from ground.paths import clusters_dir, exists, expand_path
from ground.units import parse_bandwidth, parse_bytes, parse_duration, parse_slurm_mem
from idmctl.core.cron import schedule_problem


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QosTier(_Strict):
    """One QoS tier."""

    preemptible: bool = False
    """Jobs here can be preempted (and requeued) by higher tiers."""
    preempt_cycle: str | None = None
    """Typical time before a preemptible job is preempted (card: sub ≈ 1 h)."""
    max_wall: str = "UNLIMITED"
    """Longest time limit a job may ask for."""
    max_gpus: int | None = Field(default=None, ge=0)
    """Most GPUs one job may hold in this tier."""
    partition: str | None = None
    """Partition jobs of this tier go to, when the cluster pairs them."""

    @field_validator("preempt_cycle", "max_wall")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value

    @property
    def preempt_cycle_seconds(self) -> float | None:
        return parse_duration(self.preempt_cycle) if self.preempt_cycle else None

    @property
    def max_wall_seconds(self) -> float:
        return parse_duration(self.max_wall)


class NodeFacts(_Strict):
    """What one compute node has."""

    gpus: int = Field(ge=0)
    cpus: int = Field(ge=1)
    mem: str
    """Memory a job can have on one node, as Slurm reads it (``RealMemory``: 1024-based K/M/G/T, bare = MiB)."""
    shm: str
    """Size of /dev/shm (DataLoader worker batches pass through it)."""
    scratch: str
    """Node-local staging space (NVMe /tmp)."""

    @field_validator("shm", "scratch")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_bytes(value)
        return value

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str) -> str:
        parse_slurm_mem(value)
        return value

    @property
    def shm_bytes(self) -> int:
        return parse_bytes(self.shm)

    @property
    def scratch_bytes(self) -> int:
        return parse_bytes(self.scratch)

    @property
    def mem_bytes(self) -> int:
        return parse_slurm_mem(self.mem)


class StorageFacts(_Strict):
    """Read bandwidths of the tiers a job reads from."""

    nas_read: str
    """Shared storage read bandwidth (also the stage-in copy rate), e.g. 0.9GB/s."""
    nvme_read: str
    """Node-local NVMe read bandwidth, e.g. 8GB/s."""

    page_cache_read: str | None = None
    """Rate a job's readers copy pages already in the page cache (a hit), measured with
    ``python -m bench.page_cache`` on a node. None: the io check charges every byte to the storage."""
    direct_read: str | None = None
    """O_DIRECT read rate of the staged tier on the reader's byte ranges (``bench.page_cache``): what reading
    around the page cache would get. None: not measured, and the io check says so."""

    @field_validator("nas_read", "nvme_read", "page_cache_read", "direct_read")
    @classmethod
    def _bandwidth(cls, value: str | None) -> str | None:
        # Plans divide by these rates: 0 B/s (or less) is no rate at all, never "infinitely slow".
        if value is not None and not parse_bandwidth(value) > 0:
            raise ValueError(f"a read rate must be above 0 B/s (got {value!r}); measure it (bench.page_cache) "
                             "or leave the optional ones out")
        return value

    @property
    def nas_read_bps(self) -> float:
        return parse_bandwidth(self.nas_read)

    @property
    def nvme_read_bps(self) -> float:
        return parse_bandwidth(self.nvme_read)

    @property
    def page_cache_read_bps(self) -> float | None:
        return parse_bandwidth(self.page_cache_read) if self.page_cache_read else None

    @property
    def direct_read_bps(self) -> float | None:
        return parse_bandwidth(self.direct_read) if self.direct_read else None


class HangWatch(_Strict):
    """The job script's hang watchdog (trainers/watchdog.py): a job hangs when its heartbeat has not moved
    for longer than max(k × its measured s/step, floor); the heartbeat is read every ``poll``."""

    k: float = Field(default=10.0, gt=1)
    floor: str = "0:10:00"
    """Never sooner: covers a slow first step, an evaluation, a checkpoint write between beats."""
    poll: str = "30s"
    start_floor: str = "0:05:00"
    """The first beat of an attempt must come this soon after the trainer starts, or sooner than
    ``start_margin`` × the smoke's measured build (dataset + model) allows, whichever is longer: a trainer
    stuck before its first step (a dataset build, NCCL start-up) is a hang, not a wait for the time limit."""
    start_margin: float = Field(default=3.0, ge=1)

    @field_validator("floor", "poll", "start_floor")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError("a time above 0, e.g. 5m")
        return value

    @property
    def start_floor_seconds(self) -> float:
        return parse_duration(self.start_floor)

    @property
    def floor_seconds(self) -> float:
        return parse_duration(self.floor)

    @property
    def poll_seconds(self) -> float:
        return parse_duration(self.poll)


class ControllerJob(_Strict):
    """The small job that follows every attempt of a chain on a Slurm cluster (``--dependency=afterany``)
    and runs ``idmctl sync --chain`` for it: classify, record, exclude, resubmit, with no idmctl process
    left running anywhere else. It asks for one CPU for a few seconds; put it where that is cheapest."""

    enabled: bool = True
    """False: no controller jobs; someone (or the login-node cron, or ``idmctl controller install``) runs sync."""
    qos: str | None = None
    """The QoS it runs under (a cheap, non-preemptible one: a preempted controller is requeued, not lost,
    but late); None: the cluster's default QoS."""
    partition: str | None = None
    """The partition it runs on (a CPU or debug partition); None: the cluster's default."""
    time_limit: str = "0:05:00"
    """Its wall-clock limit: a sync of one chain takes seconds; the limit bounds a store that hangs."""
    mem: str = "512MiB"
    """Its memory (the sync process, SQLAlchemy and sacct's answer)."""
    schedule: str = "*/10 * * * *"
    """How often ``idmctl controller install``'s scrontab entry syncs every chain (cron fields): a hang the
    job's own watchdog could not report is still found."""
    outage_tries: int = Field(default=6, ge=0, le=20)
    """Follow-up controllers left, at most, after one that could not reach the store (0: none; the chain
    then waits for a sync). Each that still finds the store down leaves the next, until this many ran."""
    outage_backoff: str = "2m"
    """How long after a controller that found the store down its first follow-up starts; each next one
    waits twice as long. 2m × (1 + 2 + 4 + 8 + 16 + 32) = 126 min covered by the 6 default tries."""

    @field_validator("time_limit", "outage_backoff")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @field_validator("time_limit")
    @classmethod
    def _limited(cls, value: str) -> str:
        # Slurm reads --time=0 as no limit at all: the limit that bounds a hung store would be gone.
        if not parse_duration(value) >= 60:
            raise ValueError(f"the controller's time limit must be at least 1 minute (got {value!r}; 0 is no limit to Slurm)")
        return value

    @field_validator("mem")
    @classmethod
    def _size(cls, value: str) -> str:
        parse_bytes(value)
        return value

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        problem = schedule_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class SmokeJob(_Strict):
    """``preflight EXP --smoke-on cluster``: the short one-node job the smoke runs as, where the GPUs are."""

    qos: str | None = None
    """A QoS for short tests (a debug tier); None: the user's default."""
    partition: str | None = None
    """The partition with the job's GPUs; None: the default partition."""
    gpus: int = Field(default=1, ge=0)
    """GPUs on the node (the smoke runs one rank on one); 0 on a CPU-only cluster."""
    cpus: int = Field(default=4, ge=1)
    mem: str = "16G"
    """Its memory, as Slurm reads it (1024-based K/M/G/T)."""
    time_limit: str = "0:15:00"
    """Slurm's limit for the job (the wait's deadline is ``--smoke-timeout``, queue included)."""

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str) -> str:
        if parse_slurm_mem(value) <= 0:
            raise ValueError("a size above 0, e.g. 16G")
        return value

    @field_validator("time_limit")
    @classmethod
    def _limit(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError("a time above 0, e.g. 0:15:00")
        return value


class ClusterProfile(_Strict):
    """A cluster: scheduler kind, QoS tiers, node and storage facts."""

    name: str
    description: str = ""
    scheduler: Literal["slurm", "local"] = "slurm"
    """``slurm`` submits with sbatch; ``local`` runs the job script as a subprocess."""
    qos: dict[str, QosTier]
    node: NodeFacts
    storage: StorageFacts
    queue_wait_warn: str = "1d"
    """Expected queue waits longer than this WARN in preflight (card job 5961 sat 6 days)."""
    hang: HangWatch = HangWatch()
    """When the watchdog calls a silent trainer hung."""
    controller: ControllerJob = ControllerJob()
    """The controller job after each attempt (Slurm only): where it runs, and whether at all."""
    code_store: str | None = None
    """Where submit keeps the code snapshots jobs run (``ground.code_snapshot``): a folder every node mounts.
    None: ``$IDMCTL_HOME/code`` (the local executor and a single-host cluster)."""
    runs_root: str | None = None
    """Where run directories live (``ground.paths.runs_root``): a folder on the shared filesystem every compute
    node mounts, so that the store can stay SQLite on the login node's local disk (never on NFS) while jobs
    write their logs and checkpoints where the login node reads them. None: ``$IDMCTL_HOME/runs``."""
    slurm_cluster: str | None = None
    """Slurm's ``ClusterName`` of this cluster: the gate reads the user's associations (``sacctmgr show assoc``)
    only when the Slurm tools here talk to this cluster; None: not read (a profile for another cluster)."""
    account: str | None = None
    """The account jobs are charged to when neither the spec (``resources.account``) nor ``--account`` says."""
    account_required: bool = False
    """The cluster refuses a job without ``--account``: the gate FAILs one with none, before anything is written."""
    partition: str | None = None
    """The partition when neither the spec, ``--partition`` nor the QoS tier's ``partition`` says."""
    constraint: str | None = None
    """Node features every job needs here unless the spec or ``--constraint`` says (e.g. the GPU type)."""
    reservation: str | None = None
    """A reservation every job runs in unless the spec or ``--reservation`` says."""
    smoke_job: SmokeJob = SmokeJob()
    """Where ``preflight --smoke-on cluster`` runs the smoke (Slurm only)."""
    notify: list[str] = []
    """Where sync and decide tell the team what happened (a failure and what was done, a chain stopped or
    completed, a goal's verdict): apprise URLs (``json://host/hook``, ``slack://…``, ``mailto://…``).
    ``$IDMCTL_NOTIFY``, when set, replaces this list. Checked by ``idmctl notify --test``, never here: a bad
    URL is a warning when a message is sent, never a failed load (sync must not stop over it)."""

    @field_validator("queue_wait_warn")
    @classmethod
    def _wait(cls, value: str) -> str:
        parse_duration(value)
        return value

    @property
    def queue_wait_warn_seconds(self) -> float:
        return parse_duration(self.queue_wait_warn)

    def tier(self, qos: str, *, file: str = "spec", field: str = "resources.qos") -> QosTier:
        if qos not in self.qos:
            close = difflib.get_close_matches(qos, list(self.qos), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"this cluster ({self.name}) has: {', '.join(self.qos)}"
            raise UserError(f"unknown QoS {qos!r}", file=file, field=field, hint=hint)
        return self.qos[qos]


JOB_DEFAULT_FIELDS = ("slurm_cluster", "account", "account_required", "partition", "constraint", "reservation",
                      "runs_root")
"""The profile's job defaults, association facts and where runs live: out of the profile hash while unset."""


def profile_path(name_or_path: str | None = None) -> Path:
    chosen = name_or_path or os.environ.get(ENV_CLUSTER) or "local"
    candidate = Path(chosen)
    if candidate.suffix in (".yaml", ".yml"):
        if not exists(candidate):
            raise UserError("cluster profile not found", file=chosen, hint="check IDMCTL_CLUSTER")
        return candidate.resolve()
    path = clusters_dir() / f"{chosen}.yaml"
    if not exists(path):
        known = [p.stem for p in clusters_dir().glob("*.yaml")]
        raise UserError(f"no cluster profile named {chosen!r}", file=ENV_CLUSTER,
                        hint=f"shipped: {', '.join(sorted(known))}")
    return path


def load_profile(name_or_path: str | None = None) -> tuple[ClusterProfile, str]:
    """The profile and its content hash (part of a preflight's identity)."""
    path = profile_path(name_or_path)
    from ground.spec.loader import load_yaml_file  # start-up: pulls yaml

    data = load_yaml_file(path, what="cluster profile")
    try:
        profile = ClusterProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        dotted = ".".join(str(p) for p in first["loc"])
        raise UserError(first["msg"], file=str(path), field=dotted, hint="fix the cluster profile") from exc
    for name in ("code_store", "runs_root"):
        value = getattr(profile, name)
        if value and not expand_path(value).is_absolute():
            # A relative folder is the profile's own neighbour, never each command's working directory.
            profile = profile.model_copy(update={name: str(Path(path).parent / value)})
    # Where messages go changes nothing a job does: not part of a preflight's identity. Fields added after
    # preflights were recorded count only once set, so a profile that does not use them keeps its hash.
    unset = {name for name in JOB_DEFAULT_FIELDS if getattr(profile, name) == ClusterProfile.model_fields[name].default}
    digest = hashlib.sha256(profile.model_dump_json(exclude={"notify", *unset}).encode()).hexdigest()
    return profile, digest
