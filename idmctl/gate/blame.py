"""Which submit flag turned a check into a FAIL: ``(from --qos sub)`` on the row, so the fix is to drop or
change that flag, not the spec."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from idmctl.core.job_options import RESOURCE_FIELDS, flag_of
from idmctl.core.checks import CheckResult, Measurements, PreflightContext, Status
from idmctl.gate import smoke as smoke_check
from idmctl.gate.check_list import STATIC_CHECKS, run_check

if TYPE_CHECKING:
    from idmctl.job.effective import EffectiveJob

FLAG_BLIND = ("introspection", "cache")
"""Checks no submit flag can change (they read the code, the data section and the files, never resources)."""


def _blame(job: "EffectiveJob", name: str, measured: Measurements) -> list[str]:
    """The request fields that turn check ``name`` into a FAIL: each applied alone to the spec as written.
    [] when the spec as written fails it too; every changed resource field when only their mix does."""
    from idmctl.job.effective import apply_flags  # start-up: 10 more project modules only this path needs

    module = next(m for m in STATIC_CHECKS if m.NAME == name)

    def fails(names: list[str]) -> bool:
        try:
            resolved = apply_flags(job.declared, job.options, names)
        except Exception:
            return True
        return run_check(module, PreflightContext(resolved, job.profile, measured)).status is Status.FAIL

    changed = [name for name in job.changed if name in RESOURCE_FIELDS]
    if not changed or fails([]):
        return []
    return [name for name in changed if fails([name])] or changed


def name_flags(job: "EffectiveJob", results: list[CheckResult], measured: Measurements) -> list[CheckResult]:
    """Each FAIL the flags caused, with ``(from --qos sub)`` appended and ``from_flags`` in its numbers."""
    out: list[CheckResult] = []
    for result in results:
        names: list[str] = []
        if result.status is Status.FAIL and result.name == smoke_check.NAME:
            names = [n for n in job.changed if n in ("mem", "gpus_per_node")]  # peak × ranks vs --mem
        elif result.status is Status.FAIL and result.name not in FLAG_BLIND:
            names = _blame(job, result.name, measured)
        if names:
            result = replace(result, summary=f"{result.summary} (from {', '.join(job.shown(n) for n in names)})",
                             numbers={**result.numbers, "from_flags": [flag_of(n) for n in names]})
        out.append(result)
    return out
