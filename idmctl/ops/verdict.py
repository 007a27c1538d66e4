"""The scheduler's own verdict on a job script, asked before anything is recorded as submitted.

A cluster profile mirrors the cluster's QoS tiers and limits; only the scheduler knows what it grants
this user now (QoS access, accounts, partitions, node configurations). ``sbatch --test-only`` asks
slurmctld whether it would take the exact script and queues nothing (the local executor asks
``bash -n``). One round trip, a few milliseconds on the local cluster.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ground.errors import CheckFailed
from ground.errors import UserError
from idmctl.core.executor import SchedulerRefusal
from idmctl.ops.executors import executor_for


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    command: str
    """What was asked: ``sbatch --test-only`` or ``bash -n``."""
    words: str
    """The scheduler's own answer, on one line."""
    seconds: float
    asked: bool = True
    """False when the scheduler could not be asked from here (no ``sbatch`` on PATH): ``--dry-run``
    says so, and a submit fails the same way the real ``sbatch`` would."""

    def line(self) -> str:
        if not self.asked:
            return f"scheduler not asked ({self.command}): {self.words}"
        said = "accepts the job" if self.accepted else "refuses the job"
        return f"scheduler ({self.command}) {said}: {self.words} ({self.seconds * 1000:.0f} ms)"


class SchedulerRefused(CheckFailed):
    """The scheduler would not take the job: nothing was recorded and nothing was sent."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        fix = fix_for(verdict.words) or ("the cluster profile allows what the cluster does not: "
                                         "fix the QoS, partition, account or limit it names")
        super().__init__(f"submit refused by the scheduler ({verdict.command}): {verdict.words}; "
                         f"nothing was submitted or recorded (fix: {fix})")


REFUSAL_FIXES = (
    ("Invalid feature specification", "no node has the --constraint / resources.constraint asked; the nodes' "
                                      "features: {features}"),
    ("Requested reservation is invalid", "the reservation has ended or does not exist (`scontrol show reservation`): "
                                         "drop --reservation / resources.reservation or name a current one"),
    ("Invalid account or account/partition combination", "you have no association with that account (on that "
                                                          "partition): `sacctmgr show assoc user=$USER` lists yours; "
                                                          "set --account / resources.account to one of them"),
    ("Invalid partition name", "no such partition (`sinfo -s` lists them): fix --partition / resources.partition"),
    ("Invalid qos specification", "the QoS is not granted to you: `sacctmgr show assoc user=$USER` lists yours"),
)
"""Slurm's refusal words (sbatch 22.05.8 on the local cluster, ``sbatch --test-only``) → the fix to print."""


def fix_for(words: str) -> str | None:
    """The fix for a refusal, from Slurm's own words; None for words not known here."""
    for said, fix in REFUSAL_FIXES:
        if said in words:
            return fix.format(features=_node_features()) if "{features}" in fix else fix
    return None


def _node_features() -> str:
    """``sinfo``'s node features, for the fix of a constraint no node has."""
    import subprocess

    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%f"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (sinfo did not answer)"
    features = sorted({f for line in out.split() for f in line.split(",") if f and f != "(null)"})
    return ", ".join(features) if features else "none (sinfo -o %f): drop the constraint"


def scheduler_verdict(scheduler: str, script: str) -> Verdict:
    """Ask the scheduler of a cluster profile (``slurm``/``local``) about ``script``, the batch script's
    text; never raises on a refusal (the verdict says it). The script is written to a private temporary
    file: nothing under ``$IDMCTL_HOME`` exists for a job the scheduler has not accepted."""

    executor = executor_for(scheduler)
    command = "sbatch --test-only" if executor.name == "slurm" else "bash -n"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="idmctl-verdict-") as folder:
        path = Path(folder) / "job.sbatch"
        path.write_text(script)
        try:
            words, accepted = executor.test_only(path), True
        except SchedulerRefusal as refusal:
            command, words, accepted = refusal.command, refusal.words, False
    return Verdict(accepted, command, words, time.perf_counter() - started)


def verdict_if_askable(scheduler: str, script: str) -> Verdict:
    """:func:`scheduler_verdict` for showing (``--dry-run``): a scheduler whose tools are not on this
    machine gives a verdict that says so instead of an error (a dry-run for the card from a laptop)."""

    try:
        return scheduler_verdict(scheduler, script)
    except UserError as exc:
        return Verdict(False, "sbatch --test-only", exc.line().removeprefix("error: "), 0.0, asked=False)


def require_acceptance(scheduler: str, script: str) -> Verdict:
    """:func:`scheduler_verdict`, raising :class:`SchedulerRefused` (exit 1, one line) on a refusal."""
    verdict = scheduler_verdict(scheduler, script)
    if not verdict.accepted:
        raise SchedulerRefused(verdict)
    return verdict
