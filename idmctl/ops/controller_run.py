"""What a controller job runs (``idmctl sync --chain ID --controller-for ATTEMPT``): sync the chain, record
the run on the attempt it followed, then re-arm, leave it to the next attempt's own controller, or, the
chain ended, cancel the controllers still waiting (``idmctl.ops.controller`` submits them).

A controller whose sync finds the store (or the scheduler) not answering leaves a follow-up
(``controller.submit_follow_up``) and tells the team, both without the store; the first one that finds it
again records its run with how many follow-ups it took, and says so to the team."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ground.errors import CheckFailed, UserError
from idmctl.core.executor import SchedulerUnreachable
from idmctl.core.job_state import JobState, is_terminal
from ground.contract import ENV_CLUSTER
from idmctl.job.controller_script import ENV_CONTROLLER, ENV_CONTROLLER_JOB, FollowUp
from idmctl.ops.controller import FollowedUp, cancel_controllers, chain_state, submit_controller, submit_follow_up
from idmctl.ops import notify
from idmctl.ops.sync import sync
from idmctl.record.records import ChainStatus
from idmctl.record.store import CONTROLLER, store

REARM_BEGIN_S = 20
"""A controller re-armed after an attempt that squeue says ended but sacct has not recorded yet starts no
sooner than this (its dependency already holds): one sacct flush later, not in a tight loop."""


NEWER_SCHEMA = "newer than this idmctl knows"
"""How the store says a newer idmctl migrated it (``record.db``, ``record.shared``): a follow-up running the
same snapshot would find the same, so none is left."""


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
    myself = FollowUp.decoded(os.environ.get(ENV_CONTROLLER))
    try:
        return _sync_and_follow(chain_id, after, me, myself)
    except (UserError, SchedulerUnreachable) as exc:
        raise _unreached(chain_id, after, _one_line(exc), myself, me) from exc
    except Exception as exc:  # SQLAlchemy's OperationalError and kin: the store went away mid-sync
        if type(exc).__module__.split(".")[0] != "sqlalchemy":
            raise
        raise _unreached(chain_id, after, f"the store did not answer ({type(exc).__name__})", myself, me) from exc


def _sync_and_follow(chain_id: int, after: str, me: str, myself: FollowUp | None) -> ControllerRun:
    """The controller's work, every step of which may find the store gone (the caller leaves a follow-up):
    the sync, the note of its run, then re-arm, leave it to the next attempt's controller, or cancel."""
    report = sync(chain_id=chain_id)
    result = _summary(report)
    status, attempts = chain_state(chain_id)
    attempted = next((a for a in attempts if a.scheduler_id == after), None)
    if attempted is not None:
        store().note(attempted.id, CONTROLLER, {"last_run": {
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "result": result, "ok": True,
            "scheduler_id": me or None,
            **({"follow_up": myself.follow_up, "outage_from": myself.origin} if myself and myself.follow_up else {})}})
    if myself is not None and myself.follow_up:
        _tell(notify.CONTROLLER_CAUGHT_UP, f"idmctl: chain {chain_id}'s controller caught up after a store outage",
              [f"chain: {chain_id} (after job {after})",
               f"done: follow-up {myself.follow_up} (controller job {me or '?'}) found the store again: {result}"], "success")
    if status is not ChainStatus.ACTIVE:
        return ControllerRun(chain_id, after, result, cancelled=tuple(cancel_controllers(chain_id, keep=me)))
    latest = attempts[-1] if attempts else None
    if latest is None or is_terminal(latest.state_text) or not latest.scheduler_id:
        return ControllerRun(chain_id, after, result)
    follower = (latest.controller or {}).get("scheduler_id")
    # A follow-up stands in for the controller that found the store down: that one ran, it waits on nothing.
    if follower and follower not in (me, myself.origin if myself else None):
        return ControllerRun(chain_id, after, result)  # the attempt's own controller waits on it
    begin = REARM_BEGIN_S if latest.state is JobState.UNCONFIRMED else None
    cluster = (latest.admitted or {}).get("cluster")
    rearmed = submit_controller(latest.id, chain_id, latest.attempt, latest.scheduler_id,
                                Path(latest.script_path or "").parent, cluster if isinstance(cluster, str) else None,
                                begin_s=begin)
    return ControllerRun(chain_id, after, result, rearmed=rearmed)


def _unreached(chain_id: int, after: str, why: str, myself: FollowUp | None, me: str) -> ControllerFailed:
    """The one line of a controller whose sync could not run, after leaving its follow-up and telling the
    team (neither reads the store). Outside a controller job (``myself`` None: a person ran the hidden
    flag) nothing is left behind."""
    head = f"error: controller for chain {chain_id} (after job {after}): {why}; nothing was recorded: "
    if myself is None:
        return ControllerFailed(head + "the next controller or `idmctl sync` catches up from sacct")
    if NEWER_SCHEMA in why:  # a newer idmctl migrated the store: this chain's snapshot never will read it
        next_step = (f"this chain's controllers run the idmctl that admitted it, older than the store; move the "
                     f"chain on with `idmctl submit … --resume {chain_id} --code current`, or run `idmctl sync "
                     f"--chain {chain_id}` from the upgraded idmctl")
        _tell(notify.CONTROLLER_GAVE_UP, f"idmctl: chain {chain_id} waits for a sync: its store is newer than its idmctl",
              [f"chain: {chain_id} (after job {after})", f"cause: {why}", f"done: no follow-up; {next_step}"], "failure")
        return ControllerFailed(head + next_step)
    left = submit_follow_up(chain_id, after, myself, me, os.environ.get(ENV_CLUSTER))
    next_step = _next_step(left, chain_id)
    if left.scheduler_id is None:
        _tell(notify.CONTROLLER_GAVE_UP, f"idmctl: chain {chain_id} waits for a sync: its controller gave up",
              [f"chain: {chain_id} (after job {after})", f"cause: {why}", f"done: {next_step}"], "failure")
    elif myself.follow_up == 0:
        _tell(notify.CONTROLLER_OUTAGE, f"idmctl: chain {chain_id}'s controller could not reach the store",
              [f"chain: {chain_id} (after job {after})", f"cause: {why}", f"done: {next_step}"], "warning")
    return ControllerFailed(head + next_step)


def _next_step(left: FollowedUp, chain_id: int) -> str:
    if left.scheduler_id is None:
        return (f"no follow-up controller left ({left.why}); run `idmctl sync --chain {chain_id}` once the store "
                "and Slurm answer")
    return (f"follow-up controller job {left.scheduler_id} (try {left.follow_up} of {left.of}) starts in "
            f"{left.begin_s} s and catches up from sacct")


def _tell(event: str, title: str, lines: list[str], level: str) -> None:
    notify.announce(notify.Message(event, title, [f"event: {event}", *lines], level))


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
