"""The controller inside Slurm: every attempt of a chain is followed by a small job
(``--dependency=afterany:<attempt>``, one CPU, the profile's ``controller`` QoS/partition) that runs
``idmctl sync --chain <id>``: it classifies, records, excludes and resubmits within seconds of the
attempt's end, and the resubmitted attempt gets a controller of its own. Nothing of idmctl keeps running
anywhere else. A controller is not an attempt: it has no Job row (its id is a fact on the attempt it
follows, ``JobStore.note``), spends no retry and is never a failure.

A controller that cannot reach the store writes nothing to it: the scheduler kept every state it would
have read. It leaves a follow-up instead (:func:`submit_follow_up`: the same controller, no dependency,
``--begin`` after the profile's ``controller.outage_backoff``, doubling, at most ``controller.outage_tries``
of them), tells the team (``idmctl.ops.notify``, which reads no store), and exits non-zero with one line;
the follow-up that finds the store again catches up from sacct. A chain that ends cancels the controllers
still waiting on it; ``--kill-on-invalid-dep`` removes one whose attempt vanished.

Every controller runs the chain's code snapshot (the attempt's ``code`` column), never the live clone: a
queued chain is classified and resubmitted by the idmctl that admitted it until ``submit --resume CHAIN
--code current`` moves it on (the resumed attempt's snapshot, and so its controller's, is the tree then).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ground.code_snapshot import MANIFEST
from ground.errors import CheckFailed, UserError
from ground.paths import REPO_ROOT, atomic_write_text, home
from ground.units import parse_duration
from idmctl.core.notice import warn
from idmctl.core.profile import ClusterProfile, ControllerJob, load_profile
from idmctl.job.controller_script import ControllerContext, FollowUp, controller_request, render_controller_script
from idmctl.ops.executors import executor_for
from idmctl.record.records import ChainStatus, JobRecord
from idmctl.record.store import CONTROLLER, store

CONTROLLER_LOG = "controller-%j.out"
MAX_BEGIN_S = 999_999
"""The longest ``--begin=now+N`` a controller script takes (``controller_script._BEGIN``: six digits)."""


def submit_controller(job_id: int, chain_id: int, attempt: int, after: str, run_dir: Path, cluster: str | None,
                      begin_s: int | None = None, label: str | None = None) -> str | None:
    """Submit the controller that follows attempt ``after`` (scheduler id) of ``chain_id``; returns its id,
    or None where the profile has none (a local executor, ``controller.enabled: false``). A controller that
    sbatch refuses is a warning, never a failed submit: the attempt runs, a manual sync still serves it.
    ``label`` names the script file where the attempt number alone would collide (an eval job). It runs
    the code snapshot recorded on job ``job_id`` (:func:`code_root`)."""
    profile = load_profile(cluster)[0]
    if not wanted(profile):
        return None
    root, version = code_root(_recorded_code(job_id))
    ctx = ControllerContext(chain_id=chain_id, attempt=attempt, after=after, log_path=str(run_dir / CONTROLLER_LOG),
                            idmctl_home=home(), cluster=cluster, partition=profile.controller.partition,
                            account=_charged_account(job_id) or profile.account,
                            begin=f"now+{begin_s}" if begin_s else None, repo_root=root, label=label)
    # An eval job's chain shares the training chain's run directory: its controller script is named apart.
    path = run_dir / f"controller-{label or attempt}.sbatch"
    submitted_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        scheduler_id = _sbatch(ctx, profile.controller, path)
    except CheckFailed as exc:
        warn(f"warning: no controller for job {after} (chain {chain_id}): {exc}; run `idmctl sync` for this chain")
        store().note(job_id, CONTROLLER, {"error": str(exc)[:300], "submitted_at": submitted_at})
        return None
    store().note(job_id, CONTROLLER, {"scheduler_id": scheduler_id, "after": after, "submitted_at": submitted_at,
                                      "script": str(path), "code": {"version": version, "directory": str(root)}})
    return scheduler_id


def _sbatch(ctx: ControllerContext, settings: ControllerJob, path: Path) -> str:
    """Render the controller's script to ``path`` and submit it; CheckFailed when sbatch refuses it."""
    script = render_controller_script(controller_request(ctx, settings.qos, settings.time_limit, settings.mem), ctx)
    atomic_write_text(path, script)
    return executor_for("slurm").submit(path, ctx.log_path)


def _recorded_code(job_id: int) -> dict | None:
    job = store().job(job_id)
    return dict(job.code) if job is not None and job.code is not None else None


def code_root(code: dict | None) -> tuple[Path, str | None]:
    """Where a controller of an attempt with this ``code`` record runs idmctl from, and that code's version:
    the chain's snapshot; the live clone (version None) for an attempt submitted before snapshots, or
    whose snapshot is gone (a warning: the chain is then classified by whatever the clone holds now)."""
    directory = (code or {}).get("directory")
    if directory and (Path(directory) / MANIFEST).is_file():
        return Path(directory), (code or {}).get("version")
    if directory:
        warn(f"warning: the chain's code snapshot {directory} is gone: its controller runs the live clone {REPO_ROOT}")
    return REPO_ROOT, None


@dataclass(frozen=True)
class FollowedUp:
    """A follow-up controller left by one that could not reach the store."""

    scheduler_id: str | None
    """None: none was left (the tries are spent, or sbatch refused it: ``why``)."""
    follow_up: int
    """Which try it is (1 for the first), or the try that found no one left to follow."""
    of: int
    """The profile's ``controller.outage_tries``."""
    begin_s: int = 0
    why: str = ""


def _charged_account(job_id: int) -> str | None:
    """The account the attempt's job was submitted with (its recorded options), if any."""
    job = store().job(job_id)
    account = job.options.get("account") if job is not None else None
    return account if isinstance(account, str) and account else None


def follow_up_delay_s(settings: ControllerJob, follow_up: int) -> int:
    """Seconds before follow-up ``follow_up`` (1-based) starts: the backoff, doubled for each try before it."""
    return int(round(parse_duration(settings.outage_backoff) * 2 ** (follow_up - 1)))


def submit_follow_up(chain_id: int, after: str, me: FollowUp, my_id: str, cluster: str | None) -> FollowedUp:
    """Leave the controller that tries again after this one found the store down: no store is read or
    written (the profile is a file, sbatch talks to slurmctld). The follow-up runs this same code (the
    running controller's own tree, the chain's snapshot) and starts after the backoff."""
    nxt = me.follow_up + 1
    try:
        settings = load_profile(cluster)[0].controller
    except UserError as exc:  # the profile file went bad since submit: say it, as the tries being spent would
        return FollowedUp(None, nxt, 0, why=exc.line().removeprefix("error: "))
    if nxt > settings.outage_tries:
        return FollowedUp(None, me.follow_up, settings.outage_tries, why=f"{settings.outage_tries} follow-ups ran")
    # sbatch's --begin=now+N takes at most 6 digits here (controller_script): 11.5 days is past any backoff.
    begin = min(max(follow_up_delay_s(settings, nxt), 1), MAX_BEGIN_S)
    run_dir = Path(me.run_dir)
    ctx = ControllerContext(chain_id=chain_id, attempt=me.attempt, after=after, log_path=str(run_dir / CONTROLLER_LOG),
                            idmctl_home=home(), cluster=cluster, partition=settings.partition, account=me.account,
                            begin=f"now+{begin}", follow_up=nxt, origin=me.origin or my_id or None, label=me.label)
    try:
        scheduler_id = _sbatch(ctx, settings, run_dir / f"controller-{me.label or me.attempt}-follow-up-{nxt}.sbatch")
    except (CheckFailed, UserError, OSError) as exc:
        return FollowedUp(None, nxt, settings.outage_tries, begin,
                          why=exc.line().removeprefix("error: ") if isinstance(exc, UserError) else str(exc))
    return FollowedUp(scheduler_id, nxt, settings.outage_tries, begin)


def wanted(profile: ClusterProfile) -> bool:
    return profile.scheduler == "slurm" and profile.controller.enabled


def cancel_controllers(chain_id: int, keep: str = "") -> list[str]:
    """Cancel every recorded controller of the chain's attempts except ``keep`` (the one running now);
    returns the ids cancelled. One that already ran is no error (scancel of an ended job)."""
    _, attempts = chain_state(chain_id)
    ids = [str(c["scheduler_id"]) for a in attempts if (c := a.controller or {}).get("scheduler_id")
           and c["scheduler_id"] != keep]
    cancelled = []
    for scheduler_id in ids:
        try:
            executor_for("slurm").cancel(scheduler_id)
        except CheckFailed:
            continue  # it ran and ended already
        cancelled.append(scheduler_id)
    return cancelled


def chain_state(chain_id: int) -> tuple[ChainStatus | None, list[JobRecord]]:
    """The chain's status (None: no such chain) and its attempts, oldest first."""
    records = store()
    chain = records.chain(chain_id)
    return (chain.status if chain else None), records.attempts(chain_id)


def controller_line(followed: dict) -> str:
    """One line for ``idmctl jobs``: the controller that follows an attempt, and its last run (when, result)."""
    if followed.get("error") and not followed.get("scheduler_id"):
        return f"no controller: sbatch refused it at {followed.get('submitted_at')}: {followed['error']}"
    text = f"controller job {followed.get('scheduler_id')} (submitted {followed.get('submitted_at')})"
    last = followed.get("last_run")
    if not isinstance(last, dict):
        return text + ": waiting for the attempt to end"
    outage = f" (follow-up {last['follow_up']} after a store outage)" if last.get("follow_up") else ""
    return text + f", last ran {last.get('at')}{outage}: {last.get('result')}"


def controller_code_line(followed: dict, attempt_code: dict | None) -> str:
    """One line for ``idmctl jobs show``: which idmctl the attempt's controller runs (and so which taxonomy
    classifies the attempt): the chain's snapshot, or the live clone."""
    job = f"controller job {followed.get('scheduler_id') or '— (none submitted)'}"
    if "code" not in followed:
        return f"{job} runs the live clone (submitted before controllers ran from the chain's snapshot)"
    code = followed.get("code") or {}
    if not code.get("version"):
        return f"{job} runs the live clone {code.get('directory')} (the attempt has no code snapshot)"
    whose = "this attempt's snapshot" if code.get("version") == (attempt_code or {}).get("version") else "a snapshot"
    return f"{job} runs idmctl from {whose} {code['version']} in {code.get('directory')}, not the live clone"
