"""Why a pending job waits: Slurm's reason code, read as what it means and what it waits on.

Slurm shows one reason per pending job (``squeue -o %r``, ``scontrol show job`` ``Reason=``), the
one its last scheduling attempt met (https://slurm.schedmd.com/job_reason_codes.html). The codes fall
into the families the team acts on differently: **resources** and **priority** (wait: the queue works),
**dependency** and **begin time** (it waits on something else by design), a **QoS or account limit**
(it waits for the team's own jobs to end, or never: ask for less), **held** (someone must release it),
a **reservation**, and **configuration** (the request cannot run as asked: change it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ground.units import format_duration

FAMILIES: list[tuple[str, re.Pattern[str], str]] = [
    ("held", re.compile(r"^(JobHeldUser|JobHeldAdmin|held)$"), "held: it runs only once released (scontrol release JOBID)"),
    ("dependency", re.compile(r"^(Dependency|DependencyNeverSatisfied)$"), "waits for the job(s) it depends on"),
    ("begin time", re.compile(r"^BeginTime$"), "waits for its --begin time"),
    ("resources", re.compile(r"^(Resources|Nodes_required_for_job_are_DOWN.*|NodeDown)$"),
     "waits for free resources: the nodes it needs are busy"),
    ("priority", re.compile(r"^Priority$"), "higher-priority jobs are ahead of it in its partition"),
    ("qos limit", re.compile(r"^(QOSGrp\w*|QOSMax\w*|Max\w*PerAccount|QOSJobLimit|QOSResourceLimit|QOSUsageThreshold)$"),
     "its QoS is at a limit: it waits for the QoS's other jobs (often the team's own) to end"),
    ("account limit", re.compile(r"^(AssocGrp\w*|AssocMax\w*|AccountingPolicy)$"),
     "its account (association) is at a limit: it waits for the account's other jobs to end"),
    ("reservation", re.compile(r"^(Reservation|ReqNodeNotAvail.*Reserved.*|ResvDeleted)$"),
     "waits for a reservation (its own, or one holding the nodes it needs)"),
    ("configuration", re.compile(r"^(PartitionDown|PartitionInactive|PartitionNodeLimit|PartitionTimeLimit|BadConstraints|"
                                 r"ReqNodeNotAvail.*|InvalidAccount|InvalidQOS|QOSNotAllowed|AccountNotAllowed|"
                                 r"PartitionConfig|FrontEndDown|JobLaunchFailure|NonZeroExitCode|SystemFailure)$"),
     "cannot start as asked: change the request (partition, limits, constraints, account, QoS)"),
]
"""(family, reason codes, what it means), first match wins (ReqNodeNotAvail with a reservation before the rest)."""


@dataclass(frozen=True)
class Pending:
    """Why one pending job waits."""

    family: str
    """held, dependency, begin time, resources, priority, qos limit, account limit, reservation, configuration, other."""
    reason: str
    """Slurm's own code (the evidence)."""
    meaning: str

    def line(self, waited_s: float | None = None) -> str:
        since = f" for {format_duration(waited_s)}" if waited_s is not None else ""
        return f"pending{since}: {self.family} — {self.meaning} (Slurm reason {self.reason})"


def why_pending(reason: str | None) -> Pending:
    """Slurm's reason code (``Resources``, ``QOSMaxGRESPerUser``, ``(Priority)``, ``None``) read."""
    code = (reason or "").strip().strip("()").strip()
    if not code or code == "None":
        return Pending("other", code or "none", "no reason recorded yet (the scheduler has not looked at it)")
    for family, pattern, meaning in FAMILIES:
        if pattern.match(code):
            return Pending(family, code, meaning)
    return Pending("other", code, "see https://slurm.schedmd.com/job_reason_codes.html")


def pending_line(reason: str | None, submitted_at: object) -> str:
    """``jobs show``'s line for a pending job: why it waits (Slurm's reason, read) and since its submission."""
    from datetime import datetime, timezone

    waited = None
    if isinstance(submitted_at, str):  # a row read with sqlite3 holds the stored text
        try:
            submitted_at = datetime.fromisoformat(submitted_at)
        except ValueError:
            submitted_at = None
    if isinstance(submitted_at, datetime):
        since = submitted_at if submitted_at.tzinfo else submitted_at.replace(tzinfo=timezone.utc)
        waited = max(0.0, (datetime.now(timezone.utc) - since).total_seconds())
    return why_pending(reason).line(waited)
