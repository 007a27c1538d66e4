"""Which preflight check catches a failure now, judged from where it happened, not from its cause alone.

A cause's ``caught_by`` (taxonomy.yaml) names the check for the failure as it first happened: the card's
TypeError in a dataset's constructor, caught by introspection. The same cause raised at step 2 is past
what introspection runs (it builds the objects, it takes no step) but inside the smoke's 3 steps; raised at
step 40,000 it is past every check, and the table says so instead of promising one.
"""

from __future__ import annotations

from typing import Any

from idmctl.ops.failures.classify import Cause

RUNS_THE_CODE = ("introspection", "loader", "smoke")
"""The checks that build the job's objects or run its steps: only they depend on where the job failed."""


def failing_step(detail: dict[str, Any]) -> int | None:
    """The step the attempt failed at: a marker's ``step=`` (nan_loss, hang), else one past the last step the
    log reported (``IDMCTL_STEP``, recorded as ``last_step``); None when it failed before reporting one."""
    marked = detail.get("step")
    if isinstance(marked, (int, str)) and str(marked).isdigit():
        return int(marked)
    last = detail.get("last_step")
    return last + 1 if isinstance(last, int) else None


def caught_now_by(cause: Cause, detail: dict[str, Any], smoke_steps: int | None = None) -> str:
    """``cause.caught_by``, or where the failure's step puts it: ``smoke`` inside the smoke's steps (steps
    counted from 0: step 2 needs a smoke of at least 3), ``none`` past them, each saying at which step."""
    step = failing_step(detail)
    if cause.caught_by not in RUNS_THE_CODE or step is None or step == 0:
        return cause.caught_by
    if smoke_steps is None:
        from idmctl.gate.entry_smoke import SMOKE_STEPS as smoke_steps  # start-up: only a row with a step needs it
    if step < smoke_steps:
        return f"smoke (failed at step {step}, within its {smoke_steps} steps)"
    return f"none (failed at step {step:,}, past the smoke's {smoke_steps} steps)"
