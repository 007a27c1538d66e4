"""Submit-time checks: every static check again, on the effective job (spec + flags + exclusions).

A passing preflight of the spec says nothing about ``--qos sub`` or ``--time 2-00:00:00`` given to
``submit`` afterwards (card A jobs 6054/6108/6158: a long stage-in on the preemptible tier, preempted
three times). So submit re-runs spec, introspection, loader, shm, io, qos, disk and cache on the job
it is about to send, and re-judges the smoke's stored measurement (step time, peak memory) against
the effective resources. Any FAIL refuses the submit; each FAIL the flags caused names the flag.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from idmctl.core.job_options import flag_of
from idmctl.preflight import smoke as smoke_check
from idmctl.preflight.result import CheckResult, Measurements, PreflightContext, SmokeMeasurement, Status
from idmctl.preflight.runner import NOT_RERUN, STATIC_CHECKS, _safe, gather, introspect

FLAG_BLIND = ("introspection", "cache")
"""Checks no submit flag can change (they read the code, the data section and the files, never resources)."""

if TYPE_CHECKING:
    from idmctl.jobs.effective import EffectiveJob
    from idmctl.store.models import PreflightRun


@dataclass(frozen=True)
class Admission:
    """The checks a submission was judged by, as the job row keeps them."""

    results: list[CheckResult]
    preflight_id: int | None
    seconds: float
    check_ms: dict[str, float]
    """In-process milliseconds per check (gathering the measurements is ``gather``)."""

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if r.status is Status.FAIL]

    def as_dict(self) -> dict[str, Any]:
        return {"preflight_id": self.preflight_id, "failed": self.failed, "seconds": round(self.seconds, 4),
                "check_ms": {k: round(v, 2) for k, v in self.check_ms.items()},
                "checks": [r.as_dict() for r in self.results]}


def stored_smoke(run: "PreflightRun | None") -> SmokeMeasurement | None:
    """The smoke measurement a recorded preflight made (its numbers are ``SmokeMeasurement.as_dict``)."""
    if run is None:
        return None
    for check in json.loads(run.result_json or "{}").get("checks", []):
        if check.get("name") == smoke_check.NAME and check.get("numbers"):
            fields = SmokeMeasurement.__dataclass_fields__
            return SmokeMeasurement(**{k: v for k, v in check["numbers"].items() if k in fields})
    return None


def _blame(job: "EffectiveJob", name: str, measured: Measurements) -> list[str]:
    """The request fields that turn check ``name`` into a FAIL: each applied alone to the spec as written.
    [] when the spec as written fails it too; every changed resource field when only their mix does."""
    from idmctl.core.job_options import RESOURCE_FIELDS
    from idmctl.jobs.effective import apply_flags

    module = next(m for m in STATIC_CHECKS if m.NAME == name)

    def fails(names: list[str]) -> bool:
        try:
            resolved = apply_flags(job.declared, job.options, names)
        except Exception:
            return True
        return _safe(module, PreflightContext(resolved, job.profile, measured)).status is Status.FAIL

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


def judge(job: "EffectiveJob", preflight: "PreflightRun | None", code_version: str | None,
          measurements: Measurements | None = None, memo_only: bool = False) -> Admission:
    """Run every static check on the effective job and re-judge the preflight's smoke measurement.
    With the code version, introspection and cache inspection come from the memo when nothing changed;
    ``memo_only`` (submit is refusing anyway: no passing preflight) SKIPs them rather than import torch."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    tick = time.perf_counter()
    measured = (measurements if measurements is not None
                else gather(job.resolved, job.profile, code_version, memo_only=memo_only))
    timings["gather"] = (time.perf_counter() - tick) * 1000
    # As run_preflight: step times of earlier runs count only when they ran this very code (limits.derive).
    measured = replace(measured, smoke=stored_smoke(preflight),
                       recorded_runs=[r for r in measured.recorded_runs if r.code_version == code_version])
    ctx = PreflightContext(job.resolved, job.profile, measured)
    results: list[CheckResult] = []
    for module in STATIC_CHECKS:
        tick = time.perf_counter()
        if module.NAME == "introspection":
            results.append(introspect(ctx, code_version, memo_only))
        elif module.NAME == "cache" and not measured.cache_inspected:
            results.append(CheckResult(module.NAME, Status.SKIP, NOT_RERUN, {}, ""))
        else:
            results.append(_safe(module, ctx))
        timings[module.NAME] = (time.perf_counter() - tick) * 1000
    if measured.smoke is not None:
        tick = time.perf_counter()
        judged = _safe(smoke_check, ctx)
        timings[smoke_check.NAME] = (time.perf_counter() - tick) * 1000
        results.append(replace(judged, summary=f"measured by preflight #{preflight.id if preflight else '?'}: "
                                               f"{judged.summary}"))
    else:
        why = (f"preflight #{preflight.id} stored no smoke measurement" if preflight is not None
               else "no passing preflight of this key to take the smoke's measurement from")
        results.append(CheckResult(smoke_check.NAME, Status.SKIP, why, {}, "" if preflight else "run the preflight the gate asks for"))
    blamed = name_flags(job, results, measured)
    return Admission(blamed, preflight.id if preflight else None, time.perf_counter() - started, timings)
