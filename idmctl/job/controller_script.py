"""The controller job's script: part ``controller`` of ``templates/job.sh.tmpl``, its ``#SBATCH`` header
from a :class:`JobRequest` (one CPU, the profile's QoS/partition, ``--dependency=afterany:<attempt>``,
``--kill-on-invalid-dep=yes``). Every value is validated or shell-quoted here, as in ``render.py``.

It runs from the chain's code snapshot (``repo_root``: ``python -m idmctl`` imports the snapshot's idmctl,
taxonomy included, before any installed one), so a ``git pull`` of the live clone never changes how a queued
chain is classified. A follow-up after a store outage (``follow_up`` > 0) has no dependency (its attempt
ended already, and Slurm forgets an ended job after MinJobAge) and starts at ``begin``.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ground import contract
from ground.errors import UserError
from ground.paths import REPO_ROOT
from ground.units import parse_bytes, parse_duration, slurm_time
from idmctl.core.job_options import JobRequest
from idmctl.job.render import DEPENDENCY, check_name, check_sbatch_path, check_shell_path
from idmctl.job.template import fill

ENV_CONTROLLER_JOB = "IDMCTL_CONTROLLER_JOB_ID"
"""The controller job's own Slurm id, kept under this name once its script drops the ``SLURM_*`` variables."""
ENV_CONTROLLER = "IDMCTL_CONTROLLER"
"""JSON of :class:`FollowUp`: what a controller needs to leave a follow-up with no store to read it from."""
_BEGIN = re.compile(r"^now\+\d{1,6}$")


@dataclass(frozen=True)
class ControllerContext:
    """What one controller job is for and where it writes."""

    chain_id: int
    attempt: int
    after: str
    """The attempt's scheduler id (the dependency)."""
    log_path: str
    """Absolute; may contain ``%j``."""
    idmctl_home: Path
    cluster: str | None = None
    """The profile file the chain was admitted under (``IDMCTL_CLUSTER`` of the controller's sync)."""
    partition: str | None = None
    account: str | None = None
    """The account the attempt was charged to (a cluster that requires one refuses the controller without)."""
    begin: str | None = None
    """``now+SECONDS``: start no sooner (a controller re-armed while sacct has not recorded the end yet)."""
    python: str = sys.executable
    repo_root: Path = REPO_ROOT
    """Where ``python -m idmctl`` runs from: the chain's code snapshot (the live tree only for an attempt
    submitted before snapshots, or one whose snapshot is gone)."""
    follow_up: int = 0
    """0: the controller that follows the attempt; n > 0: the n-th follow-up after a store outage."""
    origin: str | None = None
    """A follow-up's first controller (the one that found the store down): it ran, it waits on nothing."""
    label: str | None = None
    """Names the script file where the attempt number alone would collide (an eval job's controller)."""


@dataclass(frozen=True)
class FollowUp:
    """What the running controller knows of itself (``$IDMCTL_CONTROLLER``), to submit its follow-up after
    a store outage without reading the store."""

    attempt: int
    run_dir: str
    """The attempt's run directory: the follow-up's script and log go there."""
    follow_up: int = 0
    """Which try this controller is (0: the one that followed the attempt)."""
    origin: str | None = None
    """The first controller of this outage's series, once there is a series."""
    label: str | None = None
    account: str | None = None
    """The attempt's account: the follow-up is charged to it too."""

    def encoded(self) -> str:
        fields = {"attempt": self.attempt, "run_dir": self.run_dir, "follow_up": self.follow_up,
                  "origin": self.origin, "label": self.label}
        if self.account is not None:  # written only when set: scripts of jobs without one stay as they were
            fields["account"] = self.account
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def decoded(cls, text: str | None) -> "FollowUp | None":
        """From ``$IDMCTL_CONTROLLER``; None when unset or unreadable (a controller script of an older idmctl)."""
        try:
            data = json.loads(text or "")
            return cls(int(data["attempt"]), str(data["run_dir"]), int(data.get("follow_up") or 0),
                       data.get("origin") or None, data.get("label") or None, data.get("account") or None)
        except (ValueError, TypeError, KeyError):
            return None


def controller_request(ctx: ControllerContext, qos: str | None, time_limit: str, mem: str) -> JobRequest:
    """The controller's request: one CPU, after the attempt, killed if that dependency can never hold. A
    follow-up has none: its attempt ended before the first controller ran."""
    if ctx.follow_up:
        return JobRequest(qos=qos, time_limit=time_limit, mem=mem, cpus_per_node=1,
                          job_name=f"idmctl-controller-{ctx.chain_id}")
    return JobRequest(qos=qos, time_limit=time_limit, mem=mem, cpus_per_node=1, job_name=f"idmctl-controller-{ctx.chain_id}",
                      dependency=f"afterany:{ctx.after}", kill_on_invalid_dep=True)


def render_controller_script(request: JobRequest, ctx: ControllerContext) -> str:
    where = "cluster profile"
    if request.qos is not None:
        check_name(request.qos, "controller.qos", where)
    if ctx.partition is not None:
        check_name(ctx.partition, "controller.partition", where)
    if ctx.account is not None:
        check_name(ctx.account, "controller.account", where)
    check_name(request.job_name or "", "controller job name", where)
    if not ctx.follow_up and not DEPENDENCY.fullmatch(request.dependency or ""):
        raise UserError(f"{request.dependency!r} is not a job dependency", field="controller.dependency",
                        hint="afterany:<job id>")
    if ctx.begin is not None and not _BEGIN.fullmatch(ctx.begin):
        raise UserError(f"{ctx.begin!r} is not now+SECONDS", field="controller.begin", hint="e.g. now+30")
    log_path = check_sbatch_path(Path(ctx.log_path), "controller log path", contract.ENV_HOME)
    for name, value in ((contract.ENV_HOME, ctx.idmctl_home), ("python", Path(ctx.python)), ("repository", ctx.repo_root)):
        check_shell_path(str(value), name, "environment")
    directives: list[tuple[str, object]] = [
        ("job-name", request.job_name),
        ("qos", request.qos),
        ("account", ctx.account),
        ("partition", ctx.partition),
        ("nodes", 1),
        ("ntasks", 1),
        ("cpus-per-task", request.cpus_per_node or 1),
        ("mem", f"{-(-parse_bytes(request.mem or '512MiB') // 2**20)}M"),
        ("time", slurm_time(parse_duration(request.time_limit or "0:05:00"))),
        ("dependency", request.dependency),
        ("kill-on-invalid-dep", "yes" if request.kill_on_invalid_dep else None),
        ("begin", ctx.begin),
        ("output", log_path),
        ("open-mode", "append"),
        ("no-requeue", True),
    ]
    header = ["#SBATCH --" + name + ("" if value is True else f"={value}") for name, value in directives if value is not None]
    q = shlex.quote
    me = FollowUp(ctx.attempt, str(Path(ctx.log_path).parent), ctx.follow_up, ctx.origin, ctx.label, ctx.account)
    env = {contract.ENV_HOME: str(ctx.idmctl_home), **({contract.ENV_CLUSTER: ctx.cluster} if ctx.cluster else {}),
           ENV_CONTROLLER: me.encoded(), "PYTHONUNBUFFERED": "1"}
    return fill("controller", {
        "ENV_CONTROLLER_JOB": ENV_CONTROLLER_JOB,
        "sbatch_header": "\n".join(header),
        "exports": "\n".join(f"export {key}={q(value)}" for key, value in env.items()),
        "repo_root": q(str(ctx.repo_root)),
        "python": q(ctx.python),
        "chain_id": int(ctx.chain_id),
        "attempt": int(ctx.attempt),
        "after": int(ctx.after) if ctx.after.isdigit() else q(ctx.after),
    }) + "\n"
