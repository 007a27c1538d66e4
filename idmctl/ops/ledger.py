"""The GPU-hour ledger: where a team's GPU-hours went, from the job history in the store.

Card A's week charged GPU-hours to three preemptions during a 2-hour stage-in (6054/6108/6158),
a /dev/shm ENOSPC (5845) and two bugs that struck at dataset instantiation after the stage-in
(6262, 6321), and none of it trained anything. Per run of a job (a requeued job has several,
recorded by sync from ``sacct -D``):

- **charged** = GPUs × (end − start) of every run that reached a node (queue time costs nothing);
- **useful** = the charged hours whose work reached a checkpoint that was used: all of a run that
  completed; of a run followed by another run of its job or chain (which resumed from its newest
  checkpoint), the time from the trainer's ``start`` to its last ``checkpoint`` in the run directory's
  event record (ground/progress.py). Without a record (an entry other than the trainer, a job
  from before it), a run whose trainer exited ``EXIT_REQUEUE`` (the contract's "checkpointed, requeue
  me") counts whole as useful;
- **lost** = the rest, per failure cause (the run's cause from the failure table): the stage-in
  before ``start`` and the work after the last checkpoint;
- **per preemption** = lost hours of preempted runs ÷ their number: a run that never checkpointed
  loses all of it.

Runs still going are left out. Plain sqlite3, like ``failures``' read path: 10,000 jobs in well
under the 0.5 s target, with no ORM import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple

from ground.contract import EXIT_REQUEUE
from ground.errors import UserError
from ground.run_events import CHECKPOINT, START, read_events
from idmctl.core.job_state import JobState
from idmctl.ops.failures.rows import _naive_utc, _when, is_since
from idmctl.record.failures import ledger_inputs_fast, stored_ledger_inputs

GROUPINGS = ("experiment", "qos", "cause")
PREEMPTED = "preempted"
UNCLASSIFIED = "unclassified"
"""A failed run sync/`failures` has not classified yet (``idmctl failures`` classifies it)."""


@dataclass
class LedgerRow:
    group: str
    runs: int = 0
    charged_h: float = 0.0
    useful_h: float = 0.0
    lost_h: dict[str, float] = field(default_factory=dict)
    """cause → GPU-hours lost to it."""
    preemptions: int = 0
    preemption_lost_h: float = 0.0

    @property
    def lost_total_h(self) -> float:
        return sum(self.lost_h.values())

    @property
    def per_preemption_h(self) -> float | None:
        return self.preemption_lost_h / self.preemptions if self.preemptions else None

    def as_json(self) -> dict[str, Any]:
        return {"group": self.group, "runs": self.runs, "charged_gpu_h": round(self.charged_h, 4),
                "useful_gpu_h": round(self.useful_h, 4), "lost_gpu_h": round(self.lost_total_h, 4),
                "lost_gpu_h_by_cause": {k: round(v, 4) for k, v in sorted(self.lost_h.items())},
                "preemptions": self.preemptions,
                "lost_gpu_h_per_preemption": None if self.per_preemption_h is None else round(self.per_preemption_h, 4)}


class RunCost(NamedTuple):
    """One run's GPU-hours and where they went (a tuple: 10,000 of them are built per `ledger`)."""

    experiment: str
    qos: str
    useful_h: float
    lost_h: float
    cause: str | None
    """The run's failure cause (None for a completed run)."""
    ended_at: str
    """As stored (parsed only for ``--since``)."""


def _useful_seconds(run_dir: Path | None, started: datetime, ended: datetime) -> float | None:
    """Trainer start → last checkpoint within this run, from the event record; None without one."""
    if run_dir is None:
        return None
    # sacct prints whole seconds: an event in the run's last second is still the run's.
    events = [(event, at) for event, at in read_events(run_dir) if started <= at < ended + timedelta(seconds=1)]
    begun = next((at for event, at in events if event == START), None)
    saved = [at for event, at in events if event == CHECKPOINT]
    if begun is None:
        return None
    return max(0.0, (saved[-1] - begun).total_seconds()) if saved else 0.0


def _checkpointed_at_exit(run: dict[str, Any]) -> bool:
    """The trainer exited ``EXIT_REQUEUE``: it wrote a checkpoint at the end of this run."""
    codes = [run.get("exit_code") or "", *(step[2] for step in run.get("steps") or [] if len(step) > 2)]
    return any(code.split(":")[0] == str(EXIT_REQUEUE) for code in codes)


def _seconds(started: str | None, ended: str | None) -> float | None:
    start, end = _naive_utc(_when(started)), _naive_utc(_when(ended))
    return None if start is None or end is None else max(0.0, (end - start).total_seconds())


def run_costs(db: Path, user: str | None = None) -> list[RunCost] | None:
    """Every ended run's cost (of ``user``'s jobs only, when given); None when the store is missing, of
    another revision, the team's PostgreSQL store, or has failed runs that still need classifying (the
    caller classifies them first and reads with :func:`run_costs_stored`)."""
    found = ledger_inputs_fast(db, user)
    return None if found is None else _costs(*found)


def run_costs_stored(user: str | None = None) -> list[RunCost]:
    """:func:`run_costs` through the ORM, on any backend (the PostgreSQL store's only path)."""
    return _costs(*stored_ledger_inputs(user))


def _costs(jobs: list[tuple[Any, ...]], causes: dict[tuple[int, int], str]) -> list[RunCost]:
    last_attempt: dict[int, int] = {}
    for job in jobs:
        if job[1] is not None:
            last_attempt[job[1]] = max(last_attempt.get(job[1], 0), job[2])
    costs: list[RunCost] = []
    for (job_pk, chain, attempt, experiment, qos, gpus, state, exit_code, ended_at, script, seconds,
         runs) in jobs:
        chain_goes_on = chain is not None and last_attempt[chain] > attempt
        if not runs:
            runs = [{"state": state, "exit_code": exit_code, "started_at": None, "ended_at": ended_at,
                     "seconds": seconds}]
        for number, run in enumerate(runs, start=1):
            word = JobState.of(run.get("state"))
            took = run["seconds"] if "seconds" in run else _seconds(run.get("started_at"), run.get("ended_at"))
            if took is None or word in (JobState.RUNNING, JobState.PENDING) or not run.get("ended_at"):
                continue
            hours_per_second = (gpus or 0) / 3600
            if word is JobState.COMPLETED:
                costs.append(RunCost(experiment, qos or "—", took * hours_per_second, 0.0, None, run["ended_at"]))
                continue
            useful_s = 0.0
            if number < len(runs) or chain_goes_on:  # a later run resumed from this run's newest checkpoint
                ended = _naive_utc(_when(run["ended_at"]))
                assert ended is not None
                measured = _useful_seconds(Path(script).parent if script else None,
                                           (ended - timedelta(seconds=took)).replace(tzinfo=timezone.utc),
                                           ended.replace(tzinfo=timezone.utc))
                useful_s = measured if measured is not None else (took if _checkpointed_at_exit(run) else 0.0)
            useful_s = min(useful_s, took)
            costs.append(RunCost(experiment, qos or "—", useful_s * hours_per_second,
                                 (took - useful_s) * hours_per_second, causes.get((job_pk, number), UNCLASSIFIED),
                                 run["ended_at"]))
    return costs


def check_grouping(by: str) -> None:
    if by not in GROUPINGS:
        raise UserError(f"cannot group by {by!r}", field="--by", hint=f"one of: {', '.join(GROUPINGS)}")


def ledger(costs: list[RunCost], by: str, since: datetime | None = None) -> tuple[list[LedgerRow], LedgerRow]:
    """Group the runs that ended since ``since``; returns the rows (largest charge first) and the total."""
    check_grouping(by)
    groups: dict[str, LedgerRow] = {}
    total = LedgerRow(group="total")
    for cost in costs:
        if since is not None and not is_since(_when(cost.ended_at), since):
            continue
        key = {"experiment": cost.experiment, "qos": cost.qos, "cause": cost.cause or "completed"}[by]
        for row in (groups.setdefault(key, LedgerRow(group=key)), total):
            row.runs += 1
            row.charged_h += cost.useful_h + cost.lost_h
            row.useful_h += cost.useful_h
            if cost.cause is None:
                continue
            row.lost_h[cost.cause] = row.lost_h.get(cost.cause, 0.0) + cost.lost_h
            if cost.cause == PREEMPTED:
                row.preemptions += 1
                row.preemption_lost_h += cost.lost_h
    return sorted(groups.values(), key=lambda row: (-row.charged_h, row.group)), total
