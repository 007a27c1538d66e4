"""What an attempt left behind for the next one: the newest committed checkpoint, the last step it reached,
and what resume noticed on the way in (``IDMCTL_EVENT`` lines). Sync records the first two when an attempt
ends; the failure record reads them to name a crash loop and to show a resume that fell back.

A crash loop: two consecutive attempts of a chain that failed without committing a newer checkpoint, or an
attempt that committed none after one that did save one and then failed of the same cause at the same step
(checkpoint, then fail: the next attempt resumes from that checkpoint into the same failure). The same code
and data fail the same way from the same step, so resubmitting again spends the retry budget for nothing;
the chain stops at the second such attempt (cause ``crash_loop`` in taxonomy.yaml).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ground.contract import EVENTS_FILE, STEP_MARKER
from ground.run_events import CHECKPOINT, parse_event_line
from idmctl.core.job_state import is_failed
from idmctl.ops.failures.classify import MAX_LINE_CHARS, Classification, get_cause
from idmctl.record.records import JobRecord
from trainers.checkpoint import complete_checkpoints

CRASH_LOOP = "crash_loop"
_STEP = re.compile(rf"^{STEP_MARKER} step=(\d+)\b", re.MULTILINE)


def committed_step(run_dir: Path) -> tuple[int | None, str]:
    """The newest committed checkpoint's step in ``run_dir`` and where it was read: the trainer's published
    checkpoint directories, and the ``checkpoint`` events of ``events.jsonl`` (any entry may record them);
    (None, ...) when there is none yet."""
    steps = {step: "checkpoints/" for step, _ in complete_checkpoints(run_dir)}
    try:
        lines = (run_dir / EVENTS_FILE).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:  # a torn last line of an attempt that died mid-write
            continue
        if isinstance(entry, dict) and entry.get("event") == CHECKPOINT and isinstance(entry.get("step"), int):
            steps.setdefault(entry["step"], EVENTS_FILE)
    if not steps:
        return None, "no checkpoint in checkpoints/ or events.jsonl"
    newest = max(steps)
    return newest, steps[newest]


def last_step(log_text: str) -> int | None:
    """The last step the attempt reported (the entry contract's ``IDMCTL_STEP`` lines in its log)."""
    found = _STEP.findall(log_text or "")
    return int(found[-1]) if found else None


def attempt_end(script_path: str | None, log_text: str) -> dict[str, Any] | None:
    """What an attempt that just ended leaves for the next (its ``committed_step`` fact): the run directory's
    newest committed checkpoint and the last step its log reported; None without a run directory."""
    if not script_path:
        return None
    step, source = committed_step(Path(script_path).parent)
    return {"step": step, "source": source, "last_step": last_step(log_text)}


def resume_events(log_text: str) -> list[dict[str, str]]:
    """The ``IDMCTL_EVENT`` lines of an attempt's log (a corrupt checkpoint moved aside, a fallback, an
    unverified legacy checkpoint), in order."""
    events = []
    for line in (log_text or "").splitlines():
        parsed = parse_event_line(line.strip())
        if parsed is not None:
            events.append(parsed)
    return events


def with_resume_events(found: Classification, log_text: str) -> Classification:
    """``found`` with the attempt's resume events appended to its evidence (one line each) and its detail."""
    events = resume_events(log_text)
    if not events:
        return found
    lines = [_event_text(event) for event in events]
    return replace(found, evidence=[*found.evidence, *lines], detail={**found.detail, "events": events})


def _event_text(event: dict[str, str]) -> str:
    rest = " ".join(f"{key}={value}" for key, value in event.items() if key not in ("event", "at"))
    text = f"resume: {event['event']} {rest}".strip()
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1] + "…"


def _progress(job: JobRecord) -> dict[str, Any] | None:
    value = job.committed_step
    return dict(value) if value is not None else None


def _advanced(now: dict[str, Any], before: dict[str, Any] | None) -> bool:
    """Whether an attempt committed a checkpoint newer than the one it started from (``before``: what the
    attempt before it left; None for a chain's first attempt, which starts from nothing)."""
    step, earlier = now.get("step"), (before or {}).get("step")
    return step is not None and (earlier is None or step > earlier)


History = Callable[[], tuple[list[JobRecord], dict[int, str]]]
"""The chain's attempts before the job's, oldest first, and their recorded causes by job id: asked only
when a loop is possible (most failures never need them)."""


def crash_loop(job: JobRecord, found: Classification, history: History) -> Classification:
    """``found`` (the final run of ``job``, classified) as ``crash_loop`` when ``job`` and the chain's attempt
    before it both failed without committing a newer checkpoint; else ``found`` unchanged. Only causes the
    policy would retry are judged (a cause that stops the chain already costs one attempt), and not a
    preemption (the cluster's doing, free)."""
    if not _loops(found.cause) or job.chain_id is None or job.attempt < 2:
        return found
    earlier, cause_of = history()
    attempts = {other.attempt: other for other in earlier}
    previous = attempts.get(job.attempt - 1)
    if previous is None or not is_failed(previous.state_text) or not _loops(cause_of.get(previous.id)):
        return found
    limit = get_cause(found.cause).max_per_chain
    if limit is not None and sum(1 for other in earlier if cause_of.get(other.id) == found.cause) >= limit:
        return found  # the cause's own max_per_chain stops the chain: the more specific reason
    mine, theirs = _progress(job), _progress(previous)
    if mine is None or theirs is None:
        return found  # an attempt ended before this was recorded: no verdict from a guess
    before_previous = _progress(attempts[job.attempt - 2]) if job.attempt - 2 in attempts else None
    earlier_cause = cause_of[previous.id]
    if _advanced(mine, theirs):
        return found
    if _advanced(theirs, before_previous) and not _same_way(earlier_cause, theirs, found.cause, mine):
        return found  # the attempt before made progress and failed elsewhere or otherwise: no loop yet
    line = (f"crash loop: attempt {previous.attempt} (job {previous.scheduler_id}) {earlier_cause} at step "
            f"{_shown(theirs.get('last_step'))}, then attempt {job.attempt} (job {job.scheduler_id}) {found.cause} at step "
            f"{_shown(mine.get('last_step'))}; newest committed checkpoint still step {_shown(mine.get('step'))}")
    detail = {**found.detail, "loop_of": found.cause,
              "attempts": [{"attempt": a.attempt, "job": a.scheduler_id, "cause": c, "last_step": p.get("last_step"),
                            "committed_step": p.get("step")}
                           for a, c, p in ((previous, earlier_cause, theirs), (job, found.cause, mine))]}
    return Classification(cause=CRASH_LOOP, evidence=[found.evidence[0], line, *found.evidence[1:]], detail=detail)


def _same_way(earlier_cause: str, earlier: dict[str, Any], cause: str, now: dict[str, Any]) -> bool:
    """Both attempts failed of one cause at one step (a checkpoint saved before the first failure changes
    nothing: the second resumed from it and failed at the very step again)."""
    step = now.get("last_step")
    return earlier_cause == cause and step is not None and step == earlier.get("last_step")


def _loops(cause: str | None) -> bool:
    if cause is None or cause == CRASH_LOOP:
        return False
    policy = get_cause(cause)
    return policy.action != "stop" and not policy.scheduler_requeues


def _shown(step: object) -> str:
    return "none" if step is None else str(step)
