"""``idmctl failures explain LOG``: classify any log file the way sync would (an old job's log, a colleague's
paste), with what sync would do about it. Reads only the file's tail (logtail.py), so any size is cheap."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ground.errors import UserError
from idmctl.core.job_state import JobState, first_word
from idmctl.ops.failures.classify import classify, get_cause
from idmctl.ops.failures.logtail import read_log_file

_EXIT_CODE = re.compile(r"^(\d{1,3}):(\d{1,3})$")
DEFAULT_STATE = JobState.FAILED.value
"""What a job that left a log and ended badly most often records; --state says otherwise."""


@dataclass(frozen=True)
class Explanation:
    """What ``failures explain`` prints."""

    cause: str
    refines: str | None
    """The older cause this one narrows (None for a cause of its own)."""
    headline: str
    evidence: list[str]
    """Slurm's record as given (or assumed), then the log's lines that name the cause."""
    fix: str
    action: str
    """The taxonomy's action for the cause (resume, exclude_node_and_resume, rollback, stop)."""
    sync_would: str
    """What sync does after such a job, in words (idmctl/ops/retry.py what_sync_does)."""
    caught_by: str

    def as_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "refines": self.refines, "headline": self.headline, "evidence": self.evidence,
                "fix": self.fix, "action": self.action, "sync_would": self.sync_would, "caught_by": self.caught_by}


def check_state(state: str) -> str:
    """``state`` as Slurm prints it (``CANCELLED by 0`` included); anything else is a UserError."""
    if JobState.of(state) is None:
        raise UserError(f"{state!r} is not a state Slurm prints", field="--state",
                        hint="as sacct shows it: FAILED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY…")
    words = state.strip().split(" ", 1)
    return " ".join([first_word(state), *words[1:]])


def check_exit_code(exit_code: str) -> str:
    """``exit_code`` as sacct prints it (``code:signal``, each 0-255); anything else is a UserError."""
    match = _EXIT_CODE.match(exit_code)
    if match is None or int(match[1]) > 255 or int(match[2]) > 255:
        raise UserError(f"{exit_code!r} is not an exit code Slurm prints", field="--exit-code",
                        hint="code:signal as sacct shows it, e.g. 1:0 or 0:9")
    return exit_code


def explain(log: Path, state: str | None = None, exit_code: str | None = None) -> Explanation:
    """Classify ``log`` as sync would a job Slurm recorded with ``state`` and ``exit_code``."""
    from idmctl.ops.retry import what_sync_does  # start-up: only this command needs it

    state = check_state(state) if state is not None else DEFAULT_STATE
    exit_code = check_exit_code(exit_code) if exit_code is not None else None
    text = read_log_file(log)
    found = classify(state, exit_code=exit_code, log_tail=text, started=True)
    cause = get_cause(found.cause)
    return Explanation(cause=found.cause, refines=cause.refines, headline=found.headline, evidence=found.evidence,
                       fix=cause.fix, action=cause.action, sync_would=what_sync_does(found.cause),
                       caught_by=cause.caught_by)
