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
from typing import TYPE_CHECKING, Any, Protocol

from idmctl.gate import smoke as smoke_check
from idmctl.core.checks import CheckResult, Measurements, PreflightContext, SmokeMeasurement, Status
from idmctl.gate.blame import name_flags
from idmctl.gate.check_list import STATIC_CHECKS, run_check
from idmctl.gate.runner import NOT_RERUN, gather, introspect

if TYPE_CHECKING:
    from idmctl.job.effective import EffectiveJob


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


class StoredPreflight(Protocol):
    """What the gate reads of a recorded preflight run (``idmctl.record.preflights`` hands them out)."""

    id: int | None
    """The run's id (``preflight #12``)."""
    result_json: str
    """Its checks as stored: ``{"checks": [CheckResult.as_dict, ...], "failed", "smoke_flags", "job"}``."""


def stored_smoke(run: StoredPreflight | None) -> SmokeMeasurement | None:
    """The smoke measurement a recorded preflight made (its numbers are ``SmokeMeasurement.as_dict``)."""
    if run is None:
        return None
    for check in json.loads(run.result_json or "{}").get("checks", []):
        if check.get("name") == smoke_check.NAME and check.get("numbers"):
            fields = SmokeMeasurement.__dataclass_fields__
            return SmokeMeasurement(**{k: v for k, v in check["numbers"].items() if k in fields})
    return None


def judge(job: "EffectiveJob", preflight: StoredPreflight | None, code_version: str | None,
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
            results.append(run_check(module, ctx))
        timings[module.NAME] = (time.perf_counter() - tick) * 1000
    if measured.smoke is not None:
        tick = time.perf_counter()
        judged = run_check(smoke_check, ctx)
        timings[smoke_check.NAME] = (time.perf_counter() - tick) * 1000
        results.append(replace(judged, summary=f"measured by preflight #{preflight.id if preflight else '?'}: "
                                               f"{judged.summary}"))
    else:
        why = (f"preflight #{preflight.id} stored no smoke measurement" if preflight is not None
               else "no passing preflight of this key to take the smoke's measurement from")
        results.append(CheckResult(smoke_check.NAME, Status.SKIP, why, {}, "" if preflight else "run the preflight the gate asks for"))
    blamed = name_flags(job, results, measured)
    return Admission(blamed, preflight.id if preflight else None, time.perf_counter() - started, timings)
