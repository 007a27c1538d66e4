"""``idmctl preflight EXP --what-if section.field=value``: the static checks on the spec as it is and as
altered, one row per check with every changed number beside its original. Nothing is written or
recorded: a what-if is a question, not a preflight pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ground.errors import CheckFailed
from ground.spec.loader import ResolvedSpec
from ground.units import format_bytes
from idmctl.plan.budget import fmt_bandwidth, fmt_seconds, fmt_span
from idmctl.core.checks import CheckResult, Status
from idmctl.core.profile import ClusterProfile


def format_number(key: str, value: Any) -> str:
    """A check's raw number as a person reads it, by the unit its key names."""
    if value is None:
        return "—"
    if isinstance(value, str) and "hash" in key:
        return value[:12]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key.endswith("_bytes"):
        return format_bytes(value)
    if key.endswith("_bps"):
        return fmt_bandwidth(value)
    if key.endswith("_s_per_step"):
        return f"{fmt_seconds(value)}/step"
    if key.endswith("_s"):
        return fmt_span(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


BOUNDED_BY_STEP = ("step_s", "train_s", "wall_s", "derived_time_limit_s", "checkpoint_work_s",
                   "checkpoint_interval_s", "first_checkpoint_s")
"""Numbers that are lower bounds when the step time holds no measured compute (shown "≥ ...")."""


def _shown(key: str, value: Any, numbers: dict[str, Any]) -> str:
    from idmctl.plan.whatif import at_least  # start-up: only this command needs it (4 more project modules)

    text = format_number(key, value)
    return f"{at_least(numbers)}{text}" if key in BOUNDED_BY_STEP and value is not None else text


@dataclass(frozen=True)
class RowChange:
    name: str
    before: CheckResult
    after: CheckResult

    @property
    def changed_numbers(self) -> list[tuple[str, str, str]]:
        """(key, original, what-if) for every scalar number that differs."""
        rows = []
        for key in dict.fromkeys([*self.before.numbers, *self.after.numbers]):
            old, new = self.before.numbers.get(key), self.after.numbers.get(key)
            if key == "what_ifs" or isinstance(old, (dict, list)) or isinstance(new, (dict, list)) or old == new:
                continue
            rows.append((key, _shown(key, old, self.before.numbers), _shown(key, new, self.after.numbers)))
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "before": self.before.as_dict(), "after": self.after.as_dict(),
                "changed": [{"number": k, "before": b, "after": a} for k, b, a in self.changed_numbers]}


def run_what_if(resolved: ResolvedSpec, profile: ClusterProfile, profile_hash: str, texts: list[str], *,
                as_json: bool = False) -> None:
    from idmctl.cli.output import console, emit_json, make_table  # start-up: only this command needs it (1 more project modules)
    from idmctl.gate.runner import run_preflight  # start-up: only this command needs it (29 more project modules)
    from idmctl.plan.whatif import apply_overrides, parse_override  # start-up: only this command needs it (4 more project modules)

    overrides = dict(parse_override(text) for text in texts)  # every bad override exits 2 before any work
    altered = apply_overrides(resolved, overrides)
    from idmctl.record.preflights import version_for  # start-up: only this command needs it (2 more project modules)

    version = version_for(resolved.spec)
    before = run_preflight(resolved, profile, profile_hash, with_smoke=False, record=False, version=version)
    after = run_preflight(altered, profile, profile_hash, with_smoke=False, record=False, version=version)
    rows = [RowChange(a.name, a, b) for a, b in zip(before.results, after.results)]
    original = resolved.spec.model_dump(mode="json")
    settings = []
    for dotted, value in overrides.items():
        node: Any = original
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        settings.append((dotted, node, value))
    if as_json:
        emit_json({"experiment": resolved.name, "cluster": profile.name, "spec_hash": resolved.hash,
                   "what_if_hash": altered.hash, "overrides": [{"field": d, "before": b, "after": a}
                                                               for d, b, a in settings],
                   "failed_before": before.failed, "failed_after": after.failed, "recorded": False,
                   "checks": [row.as_dict() for row in rows]})
    else:
        changes = ", ".join(f"{d} {_yaml(b)} → {_yaml(a)}" for d, b, a in settings)
        table = make_table("check", "status", "changed numbers (original → what-if)", "what-if: numbers and reason",
                           "fix", title=f"what-if {resolved.name} on {profile.name}: {changes}")
        for row in rows:
            status = row.before.status.value if row.before.status is row.after.status else \
                f"{row.before.status.value} → {row.after.status.value}"
            changed = "\n".join(f"{k}: {b} → {a}" for k, b, a in row.changed_numbers) or "same"
            summary = row.after.summary if (row.changed_numbers or row.before.status is not row.after.status) else ""
            table.add_row(row.name, status, changed, summary, row.after.fix if row.after.status is not Status.PASS else "")
        console.print(table, markup=False)
        verdict = "FAIL: " + ", ".join(after.failed) if after.failed else "PASS (static)"
        console.print(f"what-if {verdict} — was {'FAIL: ' + ', '.join(before.failed) if before.failed else 'PASS'}; "
                      f"spec {resolved.short_hash} → {altered.short_hash} (not written, not recorded; "
                      f"edit the spec and run `idmctl preflight {resolved.name}` to unlock submit)", markup=False)
    if after.failed:
        raise CheckFailed("")


def _yaml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)
