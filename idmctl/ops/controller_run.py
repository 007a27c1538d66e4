"""What a controller job runs (``idmctl sync --chain ID --controller-for ATTEMPT``): sync the chain, record
the run on the attempt it followed, then re-arm, leave it to the next attempt's own controller, or, the
chain ended, cancel the controllers still waiting (``idmctl.ops.controller`` submits them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ground.errors import CheckFailed, UserError
from idmctl.core.executor import UNCONFIRMED, SchedulerUnreachable
from idmctl.core.job_state import is_terminal
from idmctl.job.controller_script import ENV_CONTROLLER_JOB
from idmctl.ops.controller import cancel_controllers, chain_state, submit_controller
from idmctl.ops.sync import sync
from idmctl.record.job_facts import CONTROLLER, record_fact

REARM_BEGIN_S = 20
"""A controller re-armed after an attempt that squeue says ended but sacct has not recorded yet starts no
sooner than this (its dependency already holds): one sacct flush later, not in a tight loop."""


class ControllerFailed(CheckFailed):
    """The controller's sync could not run (the store or the scheduler did not answer): nothing was written."""


@dataclass(frozen=True)
class ControllerRun:
    chain_id: int
    after: str
    result: str
    """One line: what the sync did for the chain."""
    rearmed: str | None = None
    """A new controller's id, when the attempt had not ended for good (requeued, or sacct lagging)."""
    cancelled: tuple[str, ...] = ()
    """Controllers of the chain cancelled because the chain ended."""


def run_controller(chain_id: int, after: str) -> ControllerRun:
    """What a controller job runs: sync the chain, record the run on the attempt it followed, then either
    re-arm (the attempt goes on), leave it to the next attempt's own controller, or, the chain ended,
    cancel the controllers still waiting."""
    me = os.environ.get(ENV_CONTROLLER_JOB) or os.environ.get("SLURM_JOB_ID", "")
    try:
        report = sync(chain_id=chain_id)
    except (UserError, SchedulerUnreachable) as exc:
        raise ControllerFailed(f"error: controller for chain {chain_id} (after job {after}): {_one_line(exc)}; nothing was "
                               "recorded: the next controller or `idmctl sync` catches up from sacct") from exc
    except Exception as exc:  # SQLAlchemy's OperationalError and kin: the store went away mid-sync
        if type(exc).__module__.split(".")[0] != "sqlalchemy":
            raise
        raise ControllerFailed(f"error: controller for chain {chain_id} (after job {after}): the store did not answer "
                               f"({type(exc).__name__}); nothing was recorded: the next controller or `idmctl sync` "
                               "catches up from sacct") from exc
    result = _summary(report)
    status, attempts = chain_state(chain_id)
    attempted = next((a for a in attempts if a["scheduler_id"] == after), None)
    if attempted is not None:
        record_fact(attempted["id"], CONTROLLER, {"last_run": {
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "result": result, "ok": True,
            "scheduler_id": me or None}})
    if status != "ACTIVE":
        return ControllerRun(chain_id, after, result, cancelled=tuple(cancel_controllers(chain_id, keep=me)))
    latest = attempts[-1] if attempts else None
    if latest is None or is_terminal(latest["state"]) or not latest["scheduler_id"]:
        return ControllerRun(chain_id, after, result)
    follower = (latest["controller"] or {}).get("scheduler_id")
    if follower and follower != me:
        return ControllerRun(chain_id, after, result)  # the attempt's own controller waits on it
    begin = REARM_BEGIN_S if latest["state"] == UNCONFIRMED else None
    rearmed = submit_controller(latest["id"], chain_id, latest["attempt"], latest["scheduler_id"],
                                Path(latest["script_path"]).parent, latest["cluster"], begin_s=begin)
    return ControllerRun(chain_id, after, result, rearmed=rearmed)


def _summary(report: object) -> str:
    resubmitted = getattr(report, "resubmitted", [])
    stopped = getattr(report, "stopped", [])
    finished = getattr(report, "finished", [])
    if resubmitted:
        return "; ".join(f"job {old} ended, resubmitted as job {new}" for old, new in resubmitted)
    if stopped:
        return "; ".join(f"job {job_id}: chain stopped — {why}" for job_id, why in stopped)[:500]
    if finished:
        return f"{len(finished)} ended, nothing to resubmit"
    elsewhere = getattr(report, "elsewhere", [])
    if elsewhere:  # a manual sync (or another controller) decided the attempt at the same moment
        return "; ".join(f"job {job_id} ended; another sync recorded and decided it" for job_id in elsewhere)
    return f"{getattr(report, 'checked', 0)} checked, none ended"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
