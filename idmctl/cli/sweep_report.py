"""``idmctl preflight SWEEP``: every variant of a ``sweep:`` spec in one process, one table — a row per
variant, a column per check, the swept values beside them. Each variant's preflight is recorded under
its own hash, so ``submit SWEEP`` finds a pass for every variant that earned one."""

from __future__ import annotations

from typing import Any

from ground.errors import CheckFailed
from ground.spec.loader import ResolvedSpec
from idmctl.core.checks import CHECK_NAMES, CheckResult
from idmctl.core.profile import ClusterProfile

def axis_text(value: Any) -> str:
    return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def cell(result: CheckResult) -> str:
    """Status plus the number that matters, so variants compare at a glance (io: s/step and wall clock)."""
    from idmctl.plan.whatif import headline  # start-up: only this command needs it (9 more project modules)

    extra = headline(result)
    return result.status.value if extra == result.status.value else f"{result.status.value} {extra}"


def run_sweep_preflight(variants: list[ResolvedSpec], profile: ClusterProfile, profile_hash: str, *,
                        with_smoke: bool, smoke_timeout_s: float, as_json: bool) -> None:
    from idmctl.cli.output import console, emit_json, make_table, styled  # start-up: only this command needs it (1 more project modules)
    from idmctl.record.preflights import version_for  # start-up: only this command needs it (2 more project modules)
    from idmctl.gate.runner import run_preflight  # start-up: only this command needs it (34 more project modules)

    version = version_for(variants[0].spec)  # once for the sweep: the variants share the code
    reports = [run_preflight(v, profile, profile_hash, with_smoke=with_smoke, smoke_timeout_s=smoke_timeout_s,
                             version=version) for v in variants]
    axes = list(variants[0].axes)
    if as_json:
        emit_json({"sweep": variants[0].sweep, "cluster": profile.name,
                   "variants": [{"name": v.name, "axes": v.axes, **r.as_dict()} for v, r in zip(variants, reports)]})
    else:
        table = make_table("variant", *axes, *CHECK_NAMES, title=f"preflight sweep {variants[0].sweep} on {profile.name}")
        for variant, report in zip(variants, reports):
            by_name = {r.name: r for r in report.results}
            table.add_row(variant.name.rsplit(".", 1)[-1], *(axis_text(variant.axes[a]) for a in axes),
                          *(styled(cell(by_name[n])) for n in CHECK_NAMES))
        console.print(table)
        for variant, report in zip(variants, reports):
            verdict = ("FAIL: " + ", ".join(report.failed) if report.failed
                       else "PASS (submit unlocked)" if report.unlocks_submit else "PASS, static only")
            console.print(f"{variant.name}: preflight #{report.run_id} {verdict} — spec {variant.short_hash}",
                          markup=False)
        console.print(f"{len(variants)} variants in {sum(r.seconds for r in reports):.1f} s; details: "
                      f"`idmctl preflight {variants[0].sweep}.<variant>`", markup=False)
    failed = [v.name for v, r in zip(variants, reports) if r.failed]
    if failed:
        raise CheckFailed(f"preflight failed for {len(failed)} of {len(variants)} variants: {', '.join(failed)}")
