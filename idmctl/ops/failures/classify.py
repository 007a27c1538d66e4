"""Classify a job that did not complete: one documented cause, the evidence lines, and details.

The causes and their patterns live in ``taxonomy.yaml`` (data, not code paths). :func:`classify`
is a pure function of what Slurm and the job log say, so it is tested on real log texts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ground.contract import FAILURE_MARKER
from ground.errors import UserError
from ground.paths import REPO_ROOT
from ground.units import format_duration, parse_duration
from idmctl.core.job_state import JobState, first_word

TAXONOMY_PATH = Path(__file__).resolve().parent / "taxonomy.yaml"
MARKER = FAILURE_MARKER  # ground.contract: the line a job prints before failing on purpose
MAX_EVIDENCE_LINES = 4
MAX_LINE_CHARS = 240
ACTIONS = ("resume", "exclude_node_and_resume", "rollback", "stop")
"""What sync may do after a cause (``action:`` in taxonomy.yaml, whose header says what each means)."""
RETRY_ACTIONS = ("resume", "exclude_node_and_resume", "rollback")
_CONDITIONS = {"state", "started", "exit_code", "derived_exit_code", "reason", "restarts_at_least", "log"}


@dataclass(frozen=True)
class Cause:
    """One entry of the taxonomy."""

    name: str
    meaning: str
    fix: str
    caught_by: str
    """The preflight check that now stops this cause before submit ("none" when none can)."""
    action: str
    """One of :data:`ACTIONS`: what sync does after a job ends this way (the retry policy is this data)."""
    mlflow_status: str
    rules: tuple[dict[str, Any], ...]
    max_per_chain: int | None = None
    """At most this many resubmissions for this cause in one chain (None: only the chain's retries budget)."""
    exclude_node_for_s: float | None = None
    """``exclude_node_and_resume``: seconds the job's node is left out of later submissions."""
    scheduler_requeues: bool = False
    """Slurm requeues such a job itself (free); where the cluster's preemption cancels instead, sync
    resubmits in its place, also without spending the chain's retries."""
    from_chain: bool = False
    """Named from the chain's attempts (the crash loop), never matched on one job's record: it has no rules."""


@dataclass(frozen=True)
class Classification:
    cause: str
    evidence: list[str]
    """Slurm's record first, then the log lines that matched (trimmed)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """python_exception/loader_config: type, message, frame (innermost project ``file:line``);
    queue_cancelled: waited_seconds; marker causes: the marker's key=value fields."""

    @property
    def headline(self) -> str:
        """The one line shown in tables."""
        if "exception_type" in self.detail:
            where = f" at {self.detail['frame']}" if self.detail.get("frame") else ""
            return f"{self.detail['exception_type']}: {self.detail['message']}{where}"
        if self.cause == "queue_cancelled" and self.detail.get("waited_seconds") is not None:
            return f"cancelled after waiting {format_duration(self.detail['waited_seconds'])} in the queue, never started"
        if len(self.evidence) > 1:
            return self.evidence[1]
        if self.cause == "preempted" and self.detail.get("ran_seconds") is not None:
            requeued = f", requeued {self.detail['restarts']}×" if self.detail.get("restarts") else ""
            return f"preempted after running {format_duration(self.detail['ran_seconds'])}{requeued}"
        return self.evidence[0] if self.evidence else ""


def load_taxonomy(path: Path = TAXONOMY_PATH) -> list[Cause]:
    """The causes in match order; a malformed file is a UserError naming the entry."""
    return list(_load_taxonomy(str(path)))


@lru_cache(maxsize=4)
def _load_taxonomy(path: str) -> tuple[Cause, ...]:
    # libyaml's loader when present: the pure-Python one takes ~15 ms of every `failures`/`sync` on this file.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (a safe loader)
    causes: list[Cause] = []
    for index, entry in enumerate(data.get("causes", [])):
        where = f"causes[{index}]"
        for rule in entry.get("rules", []):
            unknown = set(rule) - _CONDITIONS
            if unknown:
                raise UserError(f"unknown condition {sorted(unknown)[0]!r}", file=path, field=f"{where}.rules",
                                hint=f"allowed: {', '.join(sorted(_CONDITIONS))}")
            for pattern in rule.get("log", []):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise UserError(f"bad regex {pattern!r}: {exc}", file=path, field=f"{where}.rules.log",
                                    hint="fix the regular expression") from exc
        causes.append(Cause(name=entry["name"], meaning=entry["meaning"], fix=entry["fix"],
                            caught_by=entry["caught_by"], action=entry.get("action"),
                            mlflow_status=entry["mlflow_status"], rules=tuple(entry.get("rules", [])),
                            **_policy(entry, path, where)))
    if not causes or causes[-1].rules:
        raise UserError("the last cause must be the rule-less fallback", file=path, field="causes",
                        hint="end the list with `name: unknown` and `rules: []`")
    return tuple(causes)


def _policy(entry: dict[str, Any], path: str, where: str) -> dict[str, Any]:
    """The retry policy fields of one cause, checked: a typo here must not silently become "stop"."""
    action = entry.get("action")
    if action not in ACTIONS:
        raise UserError(f"action {action!r} is not one of {', '.join(ACTIONS)}", file=path, field=f"{where}.action",
                        hint="say what sync does after this cause (see the file's header)")
    policy: dict[str, Any] = {}
    limit = entry.get("max_per_chain")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1 or action not in RETRY_ACTIONS:
            raise UserError(f"max_per_chain {limit!r} needs a retrying action and an integer >= 1", file=path,
                            field=f"{where}.max_per_chain", hint="e.g. `action: rollback` with `max_per_chain: 1`")
        policy["max_per_chain"] = limit
    requeues = entry.get("scheduler_requeues", False)
    if not isinstance(requeues, bool) or (requeues and action not in RETRY_ACTIONS):
        raise UserError(f"scheduler_requeues {requeues!r} needs true/false and a retrying action", file=path,
                        field=f"{where}.scheduler_requeues", hint="e.g. `action: resume` with `scheduler_requeues: true`")
    if requeues:
        policy["scheduler_requeues"] = True
    from_chain = entry.get("from_chain", False)
    if not isinstance(from_chain, bool) or (from_chain and entry.get("rules")):
        raise UserError(f"from_chain {from_chain!r} needs true/false and no rules", file=path,
                        field=f"{where}.from_chain", hint="a cause named from the chain's attempts has `rules: []`")
    if from_chain:
        policy["from_chain"] = True
    exclude = entry.get("exclude_node_for")
    if (exclude is None) != (action != "exclude_node_and_resume"):
        raise UserError("exclude_node_for goes with, and only with, action exclude_node_and_resume", file=path,
                        field=f"{where}.exclude_node_for", hint="e.g. `exclude_node_for: 6h`")
    if exclude is not None:
        try:
            policy["exclude_node_for_s"] = parse_duration(exclude)
        except ValueError as exc:
            raise UserError(f"not a duration: {exclude!r}", file=path, field=f"{where}.exclude_node_for",
                            hint="e.g. 6h or 30min") from exc
    return policy


def cause_names() -> list[str]:
    return [cause.name for cause in load_taxonomy()]


def get_cause(name: str) -> Cause:
    for cause in load_taxonomy():
        if cause.name == name:
            return cause
    raise UserError(f"unknown cause {name!r}", field="--cause", hint=f"one of: {', '.join(cause_names())}")


def marker_line(cause: str, **fields: object) -> str:
    """The line a job prints before failing on purpose, e.g. ``IDMCTL_FAILURE cause=nan_loss step=12``."""
    return " ".join([MARKER, f"cause={cause}", *(f"{key}={value}" for key, value in fields.items())])


def classify(
    state: str,
    reason: str | None = None,
    exit_code: str | None = None,
    derived_exit_code: str | None = None,
    log_tail: str = "",
    waited_seconds: float | None = None,
    restarts: int = 0,
    started: bool | None = None,
    ran_seconds: float | None = None,
) -> Classification:
    """The first taxonomy cause whose rules match this outcome, with its evidence."""
    lines = _before_a_cancel([line.rstrip() for line in (log_tail or "").splitlines()], state)
    record = _slurm_record(state, reason, exit_code, derived_exit_code, restarts, waited_seconds, ran_seconds)
    facts = {"state": first_word(state), "started": started, "exit_code": exit_code or "",
             "derived_exit_code": derived_exit_code or "", "reason": reason or "", "restarts": restarts}
    for cause in load_taxonomy():
        for rule in cause.rules:
            matched = _rule_matches(rule, facts, lines)
            if matched is None:
                continue
            if not matched:  # a state rule: still show the log lines this cause's patterns know
                matched = _log_hits([p for r in cause.rules for p in r.get("log", [])], lines)
            detail = _detail(cause.name, lines, matched, waited_seconds, restarts)
            if ran_seconds is not None:
                detail["ran_seconds"] = ran_seconds
            evidence = [record, *(_trim(line) for line in matched[:MAX_EVIDENCE_LINES])]
            return Classification(cause=cause.name, evidence=evidence, detail=detail)
    last_lines = [_trim(line) for line in lines if line.strip()][-2:]
    return Classification(cause="unknown", evidence=[record, *last_lines])


_CANCELLED_BY_HAND = re.compile(r"\*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ \*\*\*")
"""slurmstepd's line when someone ran scancel (a preemption, time limit or node failure says "DUE TO")."""


def _before_a_cancel(lines: list[str], state: str | None) -> list[str]:
    """For a job Slurm ended CANCELLED, the log up to the cancellation: what it printed while being torn
    down (a traceback from a write to the closed srun pipe, a signal message) is the cancel's doing, not
    the cause. A traceback printed before the cancel still names the cause (one rank crashed, the others
    hung, someone cancelled)."""
    if first_word(state) != JobState.CANCELLED:
        return lines
    cut = next((index for index, line in enumerate(lines) if _CANCELLED_BY_HAND.search(line)), None)
    return lines if cut is None else lines[:cut]


def _rule_matches(rule: dict[str, Any], facts: dict[str, Any], lines: list[str]) -> list[str] | None:
    """None when the rule fails; else the log lines that matched (empty for state-only rules)."""
    if "state" in rule and facts["state"] not in {s.upper() for s in rule["state"]}:
        return None
    if "started" in rule and facts["started"] is not rule["started"]:
        return None
    if "exit_code" in rule and facts["exit_code"] not in rule["exit_code"]:
        return None
    if "derived_exit_code" in rule and facts["derived_exit_code"] not in rule["derived_exit_code"]:
        return None
    if "reason" in rule and not re.search(rule["reason"], facts["reason"]):
        return None
    if "restarts_at_least" in rule and facts["restarts"] < rule["restarts_at_least"]:
        return None
    if "log" not in rule:
        return []
    return _log_hits(rule["log"], lines) or None


def _log_hits(patterns: list[str], lines: list[str]) -> list[str]:
    compiled = [re.compile(p) for p in patterns]
    return [line for line in lines if any(p.search(line) for p in compiled)]


def _slurm_record(state: str, reason: str | None, exit_code: str | None, derived: str | None,
                  restarts: int, waited_seconds: float | None, ran_seconds: float | None) -> str:
    parts = [f"State={state}"]
    if exit_code:
        parts.append(f"ExitCode={exit_code}")
    if derived and derived != "0:0":
        parts.append(f"DerivedExitCode={derived}")
    if reason and reason != "None":
        parts.append(f"Reason={reason}")
    if restarts:
        parts.append(f"Restarts={restarts}")
    for label, seconds in (("waited", waited_seconds), ("ran", ran_seconds)):
        if seconds is not None:
            exact = f" ({seconds:,.0f} s)" if seconds >= 120 else ""
            parts.append(f"{label} {format_duration(seconds)}{exact}")
    return "Slurm: " + " ".join(parts)


def _detail(cause: str, lines: list[str], matched: list[str], waited_seconds: float | None,
            restarts: int) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    for line in matched:
        if MARKER in line:
            detail.update(_marker_fields(line))
    if cause == "queue_cancelled" and waited_seconds is not None:
        detail["waited_seconds"] = waited_seconds
    if cause == "preempted":
        detail["restarts"] = restarts
    if cause in ("python_exception", "loader_config", "oom_cuda", "shm_enospc"):
        detail.update(parse_traceback(lines))
    return detail


def _marker_fields(line: str) -> dict[str, str]:
    text = line[line.index(MARKER) + len(MARKER):]
    return dict(pair.split("=", 1) for pair in text.split() if "=" in pair)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_NOT_PROJECT = ("/site-packages/", "/dist-packages/", "<frozen ", "/lib/python3.")


def parse_traceback(lines: list[str]) -> dict[str, Any]:
    """Exception type, message and the innermost project frame of the last traceback in ``lines``.

    When the last traceback is a re-raise from a DataLoader worker ("Original Traceback"), its
    frames are the worker's; a frame is "project" unless it is in site-packages or the stdlib. A
    traceback under "Exception ignored in: ..." is one Python swallowed (the process went on): never
    the failure: in a local job's log the watchdog, TERMed while its interpreter shut down, printed
    "SystemExit: 0" after the trainer's TypeError, and that had become the evidence.
    """
    blocks: list[tuple[list[dict[str, str]], dict[str, str] | None]] = []
    frames: list[dict[str, str]] | None = None
    ignored = after_ignored = False
    for line in lines:
        stripped = line.strip()
        if stripped.endswith("Traceback (most recent call last):"):
            frames, ignored = [], after_ignored
            continue
        after_ignored = stripped.startswith("Exception ignored in")
        if after_ignored:
            frames = None
            continue
        if frames is None:
            if not _FRAME.match(line):
                continue
            frames = []  # a tail that starts inside a traceback: its header was cut off
        frame = _FRAME.match(line)
        if frame:
            frames.append(frame.groupdict())
            continue
        if line.startswith((" ", "\t")) or not stripped:
            continue  # source line or caret markers under a frame
        exception = _EXCEPTION.match(stripped)
        if not ignored:
            blocks.append((frames, exception.groupdict() if exception else {"type": stripped, "message": ""}))
        frames, ignored = None, False
    if not blocks:
        return {}
    last_frames, exception = blocks[-1]
    detail: dict[str, Any] = {"exception_type": exception["type"], "message": (exception.get("message") or "").strip()}
    for block_frames, _ in reversed(blocks):
        project = [f for f in block_frames if not any(marker in f["file"] for marker in _NOT_PROJECT)]
        if project:
            innermost = project[-1]
            detail["frame"] = f"{_relative(innermost['file'])}:{innermost['line']}"
            detail["function"] = innermost["func"]
            break
    return detail


def _relative(path: str) -> str:
    """Relative to the project, whether the job ran from the live tree or (as now) from a code snapshot."""
    from ground.code_snapshot import path_in_code

    try:
        return str(Path(path).relative_to(REPO_ROOT))
    except ValueError:
        return path_in_code(path) or path


def _trim(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "…"
