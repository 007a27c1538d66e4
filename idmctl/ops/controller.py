"""The controller inside Slurm: every attempt of a chain is followed by a small job
(``--dependency=afterany:<attempt>``, one CPU, the profile's ``controller`` QoS/partition) that runs
``idmctl sync --chain <id>``: it classifies, records, excludes and resubmits within seconds of the
attempt's end, and the resubmitted attempt gets a controller of its own. Nothing of idmctl keeps running
anywhere else. A controller is not an attempt: it has no Job row (its id is a fact on the attempt it
follows, ``record.job_facts``), spends no retry and is never a failure.

A controller that cannot reach the store exits non-zero with one line and writes nothing: the scheduler
kept every state it would have read, so the next controller or a manual ``idmctl sync`` catches up from
sacct. A chain that ends cancels the controllers still waiting on it; ``--kill-on-invalid-dep`` removes
one whose attempt vanished.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ground.errors import CheckFailed
from ground.paths import atomic_write_text, home
from idmctl.core.notice import warn
from idmctl.core.profile import ClusterProfile, load_profile
from idmctl.job.controller_script import ControllerContext, controller_request, render_controller_script
from idmctl.ops.executors import executor_for
from idmctl.record.job_facts import CONTROLLER, record_fact

CONTROLLER_LOG = "controller-%j.out"


def submit_controller(job_id: int, chain_id: int, attempt: int, after: str, run_dir: Path, cluster: str | None,
                      begin_s: int | None = None, label: str | None = None) -> str | None:
    """Submit the controller that follows attempt ``after`` (scheduler id) of ``chain_id``; returns its id,
    or None where the profile has none (a local executor, ``controller.enabled: false``). A controller that
    sbatch refuses is a warning, never a failed submit: the attempt runs, a manual sync still serves it.
    ``label`` names the script file where the attempt number alone would collide (an eval job)."""
    profile = load_profile(cluster)[0]
    if not wanted(profile):
        return None
    settings = profile.controller
    ctx = ControllerContext(chain_id=chain_id, attempt=attempt, after=after, log_path=str(run_dir / CONTROLLER_LOG),
                            idmctl_home=home(), cluster=cluster, partition=settings.partition,
                            begin=f"now+{begin_s}" if begin_s else None)
    script = render_controller_script(controller_request(ctx, settings.qos, settings.time_limit, settings.mem), ctx)
    # An eval job's chain shares the training chain's run directory: its controller script is named apart.
    path = run_dir / f"controller-{label or attempt}.sbatch"
    atomic_write_text(path, script)
    submitted_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        scheduler_id = executor_for("slurm").submit(path, ctx.log_path)
    except CheckFailed as exc:
        warn(f"warning: no controller for job {after} (chain {chain_id}): {exc}; run `idmctl sync` for this chain")
        record_fact(job_id, CONTROLLER, {"error": str(exc)[:300], "submitted_at": submitted_at})
        return None
    record_fact(job_id, CONTROLLER, {"scheduler_id": scheduler_id, "after": after, "submitted_at": submitted_at,
                                     "script": str(path)})
    return scheduler_id


def wanted(profile: ClusterProfile) -> bool:
    return profile.scheduler == "slurm" and profile.controller.enabled


def cancel_controllers(chain_id: int, keep: str = "") -> list[str]:
    """Cancel every recorded controller of the chain's attempts except ``keep`` (the one running now);
    returns the ids cancelled. One that already ran is no error (scancel of an ended job)."""
    _, attempts = chain_state(chain_id)
    ids = [c["scheduler_id"] for a in attempts if (c := a["controller"] or {}).get("scheduler_id")
           and c["scheduler_id"] != keep]
    cancelled = []
    for scheduler_id in ids:
        try:
            executor_for("slurm").cancel(scheduler_id)
        except CheckFailed:
            continue  # it ran and ended already
        cancelled.append(scheduler_id)
    return cancelled


def chain_state(chain_id: int) -> tuple[str | None, list[dict]]:
    """The chain's status and its attempts (id, attempt, scheduler id, state, controller fact), oldest first."""
    from idmctl.record.chain_attempts import attempts_of  # the ORM: not on the submit path, which imports this module
    from idmctl.record.db import session  # the ORM, as above
    from idmctl.record.models import Chain  # the ORM, as above

    with session() as db:
        chain = db.get(Chain, chain_id)
        rows = attempts_of(db, chain_id)
        attempts = [{"id": job.id, "attempt": job.attempt, "scheduler_id": job.scheduler_id, "state": job.state,
                     "script_path": job.script_path, "controller": job.controller,
                     "cluster": _cluster_of(job)}
                    for job in rows]
        return (chain.status if chain else None), attempts


def _cluster_of(job: Any) -> str | None:
    admitted = job.admitted or {}
    return admitted.get("cluster") if isinstance(admitted, dict) else None


def controller_line(followed: dict) -> str:
    """One line for ``idmctl jobs``: the controller that follows an attempt, and its last run (when, result)."""
    if followed.get("error") and not followed.get("scheduler_id"):
        return f"no controller: sbatch refused it at {followed.get('submitted_at')}: {followed['error']}"
    text = f"controller job {followed.get('scheduler_id')} (submitted {followed.get('submitted_at')})"
    last = followed.get("last_run")
    if not isinstance(last, dict):
        return text + ": waiting for the attempt to end"
    return text + f", last ran {last.get('at')}: {last.get('result')}"
