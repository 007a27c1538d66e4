"""Tell the team: a short message when sync classifies a failure (and says what it did about it), when a
chain stops or completes, and when ``idmctl decide`` writes a goal's verdict.

Sent with apprise (one URL form for Slack, e-mail, ntfy, a JSON webhook, …) to the URLs of
``$IDMCTL_NOTIFY`` when it is set (empty: nothing is sent), else the cluster profile's ``notify`` list.
A message is sent at most once per event: sync claims it in the store first (``JobStore.claim_notice``), decide
on the MLflow runs it tagged (:data:`TAG_VERDICT_NOTIFIED`).

A notification never breaks what sent it: a URL apprise does not know, a server that is down or answers
500, a timeout — each is one warning line (``core.notice.warn``) naming where the URL was configured, the
URL masked (``ground.redact.redacted_notify_url``), and sync or decide goes on. apprise's own log lines
are kept from the terminal: they would print the parts of a URL that hold its token.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ground.contract import ENV_NOTIFY
from ground.errors import UserError
from ground.redact import notify_secrets, notify_urls, redacted_notify_url
from idmctl.core.notice import warn
from idmctl.core.profile import load_profile, profile_path
from idmctl.ops.failures.classify import Classification, get_cause
from idmctl.record.records import ChainRecord, FailureRecord, JobRecord
from idmctl.record.store import store

if TYPE_CHECKING:
    from idmctl.ops.retry import Decision

TIMEOUT_S = 3.0
"""apprise's connect and read timeouts, each, per URL: a server that does not answer holds sync up by at
most 2 × 3 s per URL, once per event."""
FAILURE, STOPPED, COMPLETED, VERDICT = "failure", "chain_stopped", "chain_completed", "verdict"
"""The events, as the first word of each message's ``event:`` line (and the store's claim)."""
CONTROLLER_OUTAGE, CONTROLLER_GAVE_UP, CONTROLLER_CAUGHT_UP = (
    "controller_outage", "controller_gave_up", "controller_caught_up")
"""A chain's controller and the store (``idmctl.ops.controller_run``): it could not reach it and left a
follow-up; no follow-up is left; a follow-up found it again. Sent with no claim: the store may be down."""
TAG_VERDICT_NOTIFIED = "idmctl.notified.verdict"
"""On each run decide tagged: the verdict last announced for it, so the same verdict is announced once."""
APPRISE_LOGGER = "apprise"
FIX_URL = "use an apprise URL such as json://HOST:PORT/PATH, slack://TOKEN_A/TOKEN_B/TOKEN_C, mailto://USER:PASS@HOST"


@dataclass(frozen=True)
class Target:
    url: str
    where: str
    """Where it was configured: ``IDMCTL_NOTIFY entry 2``, ``clusters/team.yaml notify[0]``."""

    @property
    def shown(self) -> str:
        return redacted_notify_url(self.url)


@dataclass(frozen=True)
class Message:
    event: str
    title: str
    lines: list[str] = field(default_factory=list)
    level: str = "info"
    """apprise's notify type: info, success, warning, failure."""

    @property
    def body(self) -> str:
        return "\n".join(self.lines)


# ------------------------------------------------------------------------------------------ targets

def configured_targets(cluster: str | None = None) -> list[Target]:
    """``$IDMCTL_NOTIFY`` when set, else the cluster profile's ``notify``. A profile that does not load is
    UserError (the caller decides whether that stops it)."""
    if ENV_NOTIFY in os.environ:
        return [Target(url, f"{ENV_NOTIFY} entry {index}")
                for index, url in enumerate(notify_urls(os.environ[ENV_NOTIFY]), start=1)]
    profile, _ = load_profile(cluster)
    path = profile_path(cluster)
    return [Target(url, f"{path} notify[{index}]") for index, url in enumerate(profile.notify)]


def malformed(targets: list[Target]) -> list[str]:
    """One line per URL apprise cannot use (an unknown scheme, a missing token), naming where it was set."""
    if not targets:
        return []
    import apprise  # heavy (~0.5 s): only where there is somewhere to send

    with _apprise_quiet():
        return [f"{target.where}: not a notification URL apprise can use ({target.shown})"
                for target in targets if apprise.Apprise.instantiate(target.url) is None]


def check_targets(cluster: str | None = None) -> list[Target]:
    """The configured targets, or UserError (exit 2) naming the first malformed one and the fix: for a
    command that validates the configuration (``idmctl notify --test``), never for sync."""
    targets = configured_targets(cluster)
    bad = malformed(targets)
    if bad:
        raise UserError(bad[0], hint=FIX_URL)  # bad[0] starts with where it is set: the file and entry, or the variable
    return targets


@dataclass
class TrialSend:
    targets: list[Target]
    failed_where: list[str] = field(default_factory=list)
    empty_reason: str = ""
    """Why no URL is configured, when none is."""


def send_test(cluster: str | None = None, deliver: bool = True) -> TrialSend:
    """``idmctl notify --test``: the configured targets checked (UserError on a malformed one: nothing is
    sent then), and with ``deliver`` one test message to each; the targets that did not take it are warned."""
    targets = check_targets(cluster)
    if not targets:
        where = (f"{ENV_NOTIFY} is set and empty: nothing is sent" if ENV_NOTIFY in os.environ
                 else f"set {ENV_NOTIFY} or the cluster profile's notify list ({profile_path(cluster)})")
        return TrialSend([], empty_reason=where)
    found = TrialSend(targets)
    if deliver:
        for target in targets:
            message = Message("test", "idmctl: test notification",
                              ["event: test", f"from: idmctl notify --test, configured as {target.where}"])
            if send(message, [target]):
                found.failed_where.append(target.where)
    return found


# ---------------------------------------------------------------------------------------------- send

class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _apprise_quiet() -> Iterator[_Records]:
    """apprise's warnings collected here instead of reaching the terminal (Python's last-resort handler
    prints a library's warnings when the program configured none): they may quote a URL's token."""
    logger = logging.getLogger(APPRISE_LOGGER)
    handler, propagate = _Records(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def send(message: Message, targets: list[Target]) -> list[str]:
    """Send ``message`` to each target; returns the warning line of each that failed (each also warned).
    Never raises for a target's sake: a notification must not break sync or decide."""
    if not targets:
        return []
    import apprise  # heavy (~0.5 s): only when there is a message and somewhere to send it

    # Longest first: a password replaced before the user info holding it would leave the rest of that behind.
    secrets = sorted({secret for target in targets for secret in notify_secrets(target.url)}, key=len, reverse=True)
    failed = []
    for target in targets:
        with _apprise_quiet() as records:
            try:
                plugin = apprise.Apprise.instantiate(target.url)
                if plugin is None:
                    reason = f"not a notification URL apprise can use; {FIX_URL}"
                else:
                    plugin.socket_connect_timeout = plugin.socket_read_timeout = TIMEOUT_S
                    sent = plugin.notify(body=message.body, title=message.title, notify_type=message.level)
                    reason = "" if sent else (records.messages[-1] if records.messages else "not delivered")
            except Exception as exc:  # apprise or a transport below it: any failure is this one target's
                reason = f"{type(exc).__name__}: {exc}"
        if reason:
            for secret in secrets:
                reason = reason.replace(secret, "***")
            line = (f"warning: notification ({message.event}) not sent to {target.shown} ({target.where}): "
                    f"{reason.strip()}")
            warn(line)
            failed.append(line)
    return failed


def announce(message: Message) -> None:
    """Send ``message`` to the configured targets, reading no store (a controller that cannot reach it
    says so this way). Never raises: a warning line instead."""
    try:
        send(message, _targets_or_warn())
    except Exception as exc:  # a notification is never worth more than the line that says it failed
        warn(f"warning: no notification ({message.event}): {type(exc).__name__}: {exc}")


def _targets_or_warn() -> list[Target]:
    try:
        return configured_targets()
    except UserError as exc:
        warn(f"warning: no notification sent: {exc.line().removeprefix('error: ')}")
        return []


# ------------------------------------------------------------------------------------------- sync's

def _job_line(job: JobRecord, chain: ChainRecord | None) -> str:
    where = f"{job.experiment}#{chain.id}" if chain is not None else job.experiment
    return f"job: {where} attempt {job.attempt}, {job.executor} job {job.scheduler_id} (idmctl job {job.id})"


def decision_message(job: JobRecord, chain: ChainRecord | None, decision: Decision, report: Any,
                     failure: FailureRecord | None) -> Message:
    """The message for what sync decided about a job that ended: its cause, evidence and fix from the
    Failure row the decision read, and what was done: as ``report`` (sync's ``SyncReport``, not imported:
    sync imports this module) lists it in ``resubmitted`` and ``stopped``."""
    job_id = job.id
    if decision.action == "done":
        return Message(COMPLETED, f"idmctl: {job.experiment} chain {job.chain_id} completed",
                       [f"event: {COMPLETED}", _job_line(job, chain),
                        f"done: chain completed at attempt {job.attempt}"], "success")
    lines = [_job_line(job, chain), f"cause: {decision.cause}"]
    if failure is not None:
        lines.append(f"evidence: {Classification(failure.cause, failure.evidence.splitlines(), dict(failure.detail)).headline}")
    lines.append(f"fix: {get_cause(decision.cause).fix}")
    resubmitted = dict(report.resubmitted).get(job_id)
    stopped = dict(report.stopped).get(job_id)
    if resubmitted is not None:
        new = store().job(resubmitted)
        shown = f"{new.executor} job {new.scheduler_id} " if new is not None and new.scheduler_id else ""
        event, level = FAILURE, "warning"
        lines.append(f"done: resubmitted as {shown}(idmctl job {resubmitted}, attempt {job.attempt + 1}): {decision.why}")
    elif stopped is not None:
        event, level = STOPPED, "failure"
        lines.append(f"done: chain stopped: {stopped}")
    else:
        event, level = FAILURE, "warning"
        lines.append("done: nothing")
    title = f"idmctl: {job.experiment} chain {job.chain_id} " + (
        f"stopped ({decision.cause})" if event == STOPPED else f"attempt {job.attempt} failed ({decision.cause})")
    return Message(event, title, [f"event: {event}", *lines], level)


def announce_decision(job_id: int, decision: Decision, report: Any) -> None:
    """Tell the team what sync decided about job ``job_id`` (once per job and event). Never raises: a
    notification that cannot be built or sent is a warning line and sync's result stays as it is."""
    try:
        targets = _targets_or_warn()
        if not targets:
            return
        records = store()
        job = records.job(job_id)
        if job is None:
            return
        chain = records.chain(job.chain_id) if job.chain_id is not None else None
        failure = final_failure(records.failures([job_id])) if decision.action != "done" else None
        message = decision_message(job, chain, decision, report, failure)
        if not records.claim_notice(job_id, message.event):
            return
        send(message, targets)
    except Exception as exc:  # a notification is never worth a failed sync: say it, and go on
        warn(f"warning: no notification for job {job_id}: {type(exc).__name__}: {exc}")


def final_failure(failures: list[FailureRecord]) -> FailureRecord | None:
    """The failure of the job's final run (the one its retry decision read), or None."""
    final = [failure for failure in failures if failure.final]
    return max(final, key=lambda failure: (failure.run, failure.id)) if final else None


# ----------------------------------------------------------------------------------------- decide's

def verdict_key(report: Any) -> str:
    """What is announced about a decision: a new verdict, interval or step is news, the same one is not."""
    est = report.estimate
    interval = f"[{est.low:.2f}, {est.high:.2f}]" if est is not None else ""
    steps = ",".join(str(s) for s in sorted({run.step for run in report.runs}))
    return f"{report.verdict} {report.goal} {interval} step {steps}"


def verdict_message(report: Any) -> Message:
    runs = ", ".join(f"{run.label} (MLflow run {run.run_id}, step {run.step})" for run in report.runs)
    verdict = next((line for line in report.lines if line.startswith("verdict: ")), f"verdict: {report.verdict}")
    estimate = next((line for line in report.lines if line.startswith(("estimate: ", "95 % interval: "))), None)
    level = {"PASS": "success", "FAIL": "failure"}.get(report.verdict, "info")
    lines = [f"event: {VERDICT}", f"subject: {report.subject}", f"goal: {report.goal} under {report.protocol}",
             verdict, *([estimate] if estimate else []), f"runs: {runs}",
             "done: verdict tagged on the runs (idmctl.decision.*)"]
    return Message(VERDICT, f"idmctl decide {report.subject}: {report.verdict}", lines, level)


def announce_verdicts(client: Any, reports: list[Any]) -> None:
    """Tell the team each verdict decide just tagged, unless its runs already announced this same one.
    Never raises (a warning line instead): the verdict is on the runs whatever happens here."""
    try:
        targets = _targets_or_warn()
        if not targets:
            return
        for report in reports:
            if not report.runs:
                continue
            key = verdict_key(report)
            if all(client.get_run(run.run_id).data.tags.get(TAG_VERDICT_NOTIFIED) == key for run in report.runs):
                continue
            for run in report.runs:
                client.set_tag(run.run_id, TAG_VERDICT_NOTIFIED, key)
            send(verdict_message(report), targets)
    except Exception as exc:  # a notification is never worth a failed decide: say it, and go on
        warn(f"warning: no verdict notification: {type(exc).__name__}: {exc}")
