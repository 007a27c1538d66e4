"""What-ifs: a spec altered by ``section.field=value`` overrides, never written back, and the fixes every
FAIL/WARN carries, each recomputed by running the very same check on the altered spec.

``idmctl preflight EXP --what-if loader.repeats=8`` and sweeps (``sweep:`` axes) both go through
:func:`apply_overrides`, so a bad override is the same one-line error with a did-you-mean everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from ground.errors import UserError
from ground.provenance import Basis
from ground.spec.overrides import SOURCE, apply_overrides, check_path, field_paths, parse_override  # noqa: F401
from ground.units import format_bytes
from idmctl.plan.budget import fmt_seconds, fmt_span, staging
from idmctl.plan.limits import derive
from idmctl.core.checks import CheckResult, PreflightContext, Status

# -- fixes with numbers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Alternative:
    """One fix: the overrides, and what the same check says about the altered spec."""

    overrides: dict[str, Any]
    status: Status
    headline: str

    def text(self) -> str:
        sets = " ".join(f"{k}={_show(v)}" + (f" (N={len(v)})" if k == "data.selected_layer_indices" else "")
                        for k, v in self.overrides.items())
        shown = self.status is Status.PASS or self.headline == self.status.value
        return f"{sets} → {self.headline}" + ("" if shown else f" ({self.status.value})")

    def as_dict(self) -> dict[str, Any]:
        return {"set": self.overrides, "status": self.status.value, "headline": self.headline}


def _show(value: Any) -> str:
    """As it is typed after ``--what-if field=`` (YAML: ``true``, ``[1,4,7,10]``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def at_least(numbers: dict[str, Any]) -> str:
    """``"≥ "`` when the check's step time holds no measured compute (its times are lower bounds)."""
    return "≥ " if (numbers.get("step_provenance") or {}).get("basis") == Basis.LOWER_BOUND.value else ""


def headline(result: CheckResult) -> str:
    """The numbers a fix changes, short: s/step and wall clock for io, bytes for shm and disk."""
    n = result.numbers
    if result.name == "io" and "step_s" in n:
        bound = at_least(n)
        return f"{bound}{fmt_seconds(n['step_s'])}/step, {bound}{fmt_span(n['wall_s'])}"
    if result.name in ("shm", "disk") and n.get("capacity_bytes"):
        need = n.get("need_bytes", n.get("stage_bytes", 0))
        return f"{format_bytes(need)} of {format_bytes(n['capacity_bytes'])}"
    if result.name == "qos":
        parts = []
        if n.get("first_checkpoint_s") is not None:
            parts.append(f"first checkpoint at {fmt_span(n['first_checkpoint_s'])} vs preempt cycle "
                         f"{fmt_span(n['preempt_cycle_s'])}")
        if n.get("expected_wait_s") is not None:
            parts.append(f"expected queue wait {fmt_span(n['expected_wait_s'])}")
        if parts:
            return ", ".join(parts)
    return result.status.value


def evenly_spread(cached: int, n: int) -> list[int]:
    """N cache indices spread evenly over the cached layers (12 cached, N=4 → 1,4,7,10: the card's choice)."""
    return [int((i + 0.5) * cached / n) for i in range(n)]


def _candidates_io(ctx: PreflightContext) -> Iterable[list[dict[str, Any]]]:
    spec = ctx.spec
    limits = derive(ctx)
    if limits.time_warning:  # the run fits; the spec over-asks: the fix is the derived limit
        yield [{"resources.time_limit": limits.derived_time_limit_slurm}]
        return
    batch = spec.loader.batch_size
    yield [{"loader.repeats": k} for k in range(spec.loader.repeats + 1, batch + 1) if batch % k == 0]
    cached = len(spec.data.cached_layers)
    yield [{"data.selected_layer_indices": evenly_spread(cached, n)} for n in range(spec.data.routing_n - 1, 0, -1)]
    if not spec.stage.enabled:
        yield [{"stage.enabled": True}]


def _candidates_shm(ctx: PreflightContext) -> Iterable[list[dict[str, Any]]]:
    loader = ctx.spec.loader
    yield [{"loader.num_workers": w} for w in range(loader.num_workers - 1, -1, -1)]
    yield [{"loader.repeats": k} for k in range(loader.repeats + 1, loader.batch_size + 1) if loader.batch_size % k == 0]


def _candidates_qos(ctx: PreflightContext) -> Iterable[list[dict[str, Any]]]:
    res, gpus = ctx.spec.resources, ctx.spec.resources.gpus_per_node * ctx.spec.resources.nodes
    limits = derive(ctx)
    if limits.checkpoint_warning:
        yield [{"train.checkpoint_every": int(limits.checkpoint_every.derived)}]
    tier = ctx.profile.qos.get(res.qos)
    waits = [w for w in ctx.measurements.queue_waits if w.qos == res.qos and w.gpus == gpus]
    if tier is None or not (tier.preemptible or waits):
        return  # nothing another tier would change
    steady = [name for name, other in ctx.profile.qos.items()
              if name != res.qos and not other.preemptible and (other.max_gpus is None or gpus <= other.max_gpus)]
    yield [{"resources.qos": name} for name in steady]
    if not tier.preemptible or staging(ctx).seconds >= (tier.preempt_cycle_seconds or 0):
        return  # checkpointing more often cannot help a job preempted before its first step
    every = int(limits.checkpoint_every.effective)  # the spec's, or the derived one when it sets none
    yield [{"train.checkpoint_every": e} for e in sorted({max(1, every // d) for d in (2, 4, 10, 100)}, reverse=True)
           if e < every]


def _candidates_disk(ctx: PreflightContext) -> Iterable[list[dict[str, Any]]]:
    if ctx.spec.stage.enabled:
        yield [{"stage.enabled": False}]


CANDIDATES: dict[str, Callable[[PreflightContext], Iterable[list[dict[str, Any]]]]] = {
    "io": _candidates_io, "shm": _candidates_shm, "qos": _candidates_qos, "disk": _candidates_disk,
}
"""Per check: families of overrides, each tried in order, mildest first; the first member the check
PASSes is the fix shown, or the last one tried when none does (the most that family can buy)."""


def alternatives(ctx: PreflightContext, module: Any, result: CheckResult) -> list[Alternative]:
    """For a FAIL/WARN, the fixes worth showing, each with the same check rerun on the altered spec."""
    found: list[Alternative] = []
    for family in CANDIDATES.get(result.name, lambda _: [])(ctx):
        best: Alternative | None = None
        for overrides in family:
            try:
                altered = apply_overrides(ctx.resolved, overrides)
            except UserError:
                continue  # e.g. repeats that break another rule: not a fix
            rerun = module.check(replace(ctx, resolved=altered))
            best = Alternative(overrides, rerun.status, headline(rerun))
            if rerun.status is Status.PASS:
                break
        if best is not None:
            found.append(best)
    return found


def with_fixes(ctx: PreflightContext, module: Any, result: CheckResult) -> CheckResult:
    """``result`` with its fix extended by recomputed alternatives (and them under numbers['what_ifs'])."""
    if result.status not in (Status.FAIL, Status.WARN) or result.name not in CANDIDATES:
        return result
    found = alternatives(ctx, module, result)
    if not found:
        return result
    lines = "; ".join(alt.text() for alt in found)
    fix = f"{result.fix}; what-ifs: {lines}" if result.fix else f"what-ifs: {lines}"
    return replace(result, fix=fix, numbers={**result.numbers, "what_ifs": [alt.as_dict() for alt in found]})
