"""Which submit flag turned a check into a FAIL: ``(from --qos sub)`` on the row, so the fix is to drop or
change that flag, not the spec."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from idmctl.core.checks import CheckResult, Measurements, PreflightContext, Status
from idmctl.gate import smoke as smoke_check
from idmctl.gate.check_list import STATIC_CHECKS, run_check

if TYPE_CHECKING:
    from idmctl.job.effective import EffectiveJob

FLAG_BLIND = ("introspection", "cache")
"""Checks no submit flag can change (they read the code, the data section and the files, never resources)."""


def _blame(job: "EffectiveJob", name: str, measured: Measurements) -> list[str]:
    """The flags that turn check ``name`` into a FAIL: each flag applied alone to the spec as written.
    [] when the spec as written fails it too; every changed resource flag when only their mix does."""
    from idmctl.job.effective import SPEC_FLAGS, apply_flags

    module = next(m for m in STATIC_CHECKS if m.NAME == name)

    def fails(flags: list[str]) -> bool:
        try:
            resolved = apply_flags(job.declared, job.options, flags)
        except Exception:
            return True
        return run_check(module, PreflightContext(resolved, job.profile, measured)).status is Status.FAIL

    changed = [flag for flag in job.changed_flags if flag in SPEC_FLAGS]
    if not changed or fails([]):
        return []
    return [flag for flag in changed if fails([flag])] or changed


def name_flags(job: "EffectiveJob", results: list[CheckResult], measured: Measurements) -> list[CheckResult]:
    """Each FAIL the flags caused, with ``(from --qos sub)`` appended and ``from_flags`` in its numbers."""
    out: list[CheckResult] = []
    for result in results:
        flags: list[str] = []
        if result.status is Status.FAIL and result.name == smoke_check.NAME:
            flags = [f for f in job.changed_flags if f in ("--mem", "--gres")]  # peak × ranks vs --mem
        elif result.status is Status.FAIL and result.name not in FLAG_BLIND:
            flags = _blame(job, result.name, measured)
        if flags:
            result = replace(result, summary=f"{result.summary} (from {', '.join(job.shown(f) for f in flags)})",
                             numbers={**result.numbers, "from_flags": flags})
        out.append(result)
    return out
