"""``idmctl exp list|show|validate|register|diff``: the experiment specs."""

from __future__ import annotations

from typing import Annotated, Any

from typing import TYPE_CHECKING

import typer

from idmctl.cli.commands import options
from ground.tracking import flatten
from idmctl.cli.output import console, emit_json, make_table

if TYPE_CHECKING:
    from ground.spec import ResolvedSpec

# The spec modules (pydantic, yaml) load inside the commands: `idmctl failures` or `jobs` must not pay
# for them at start-up.

app = typer.Typer(help="Experiment specs: list, show, validate, register, diff.", no_args_is_help=True)


def _summary(resolved: ResolvedSpec) -> dict[str, Any]:
    spec = resolved.spec
    return {
        "name": resolved.name,
        "hash": resolved.short_hash,
        "routing_n": spec.data.routing_n,
        "depth": spec.model.depth,
        "gpus": spec.resources.gpus_per_node * spec.resources.nodes,
        "qos": spec.resources.qos,
        "steps": spec.train.steps,
        "effective_batch": spec.train.effective_batch,
        "goal": spec.goal,
        "description": spec.description,
    }


@app.command("list")
def list_cmd(as_json: options.Json = False) -> None:
    """Every runnable experiment in experiments/ (bases excluded), validated."""
    from ground.spec import list_experiments, load_experiments  # start-up: pulls pydantic and yaml

    summaries = [_summary(variant) for path in list_experiments() for variant in load_experiments(str(path))]
    if as_json:
        emit_json(summaries)
        return
    table = make_table("experiment", "N", "depth", "GPUs", "QoS", "steps", "eff. batch", "goal", "hash")
    for spec in summaries:  # a spec's summary, not a job's row
        table.add_row(spec["name"], str(spec["routing_n"]), str(spec["depth"]), str(spec["gpus"]), spec["qos"],
                      f"{spec['steps']:,}", f"{spec['effective_batch']:,}", spec["goal"] or "—", spec["hash"])
    console.print(table)


@app.command("show")
def show_cmd(experiment: options.Experiment, as_json: options.Json = False,
             cluster: Annotated[str | None, typer.Option("--cluster", help="Cluster profile the limits are derived for (default $IDMCTL_CLUSTER or local).")] = None) -> None:
    """The resolved spec (bases merged, defaults filled), the values derived from it, and the time limit,
    checkpoint interval and signal lead derived from measurements, with their arithmetic."""
    import yaml

    from ground.spec import load_spec  # start-up: pulls pydantic and yaml
    from idmctl.plan.limits import limits_for  # start-up: pulls pydantic and yaml
    from idmctl.core.profile import load_profile  # start-up: pulls pydantic
    from idmctl.record.specs import derived_values  # start-up: pulls sqlalchemy and pydantic

    resolved = load_spec(experiment)
    profile, _ = load_profile(cluster)
    limits = limits_for(resolved, profile)
    document = {
        "name": resolved.name,
        "hash": resolved.hash,
        "extends": [str(p.name) for p in resolved.chain[:-1]],
        "spec": resolved.canonical,
        "derived": derived_values(resolved.spec),
        "limits": {"cluster": profile.name, "step_s": limits.step_s, "step_source": limits.step_source,
                   "step_provenance": limits.step_provenance.as_dict(),
                   "checkpoint_write_s": limits.write_s, "write_source": limits.write_source,
                   **{item.name.replace(" ", "_"): {"derived": item.derived, "effective": item.effective,
                                                    "source": item.source, "arithmetic": item.arithmetic}
                      for item in (limits.time_limit, limits.checkpoint_every, limits.signal_lead)},
                   "warnings": [w for w in (limits.time_warning, limits.checkpoint_warning) if w]},
    }
    if as_json:
        emit_json(document)
        return
    console.print(f"# {resolved.name}  hash {resolved.hash}")
    if document["extends"]:
        console.print(f"# extends: {' → '.join(document['extends'])}")
    console.print(yaml.safe_dump(document["spec"], sort_keys=False).rstrip(), markup=False)
    console.print("# derived (computed, never configured):")
    console.print(yaml.safe_dump(document["derived"], sort_keys=False).rstrip(), markup=False)
    console.print(f"# limits on {profile.name} (derived from measurement; a value in the spec wins):", markup=False)
    for line in limits.lines():
        console.print(f"  {line}", markup=False)


@app.command("validate")
def validate_cmd(
    experiments: Annotated[list[str] | None, typer.Argument(help="Names or paths; default: every shipped experiment.")] = None,
    as_json: options.Json = False,
) -> None:
    """Validate specs strictly; exit 2 on the first bad one with a one-line error."""
    from ground.spec import list_experiments, load_experiments  # start-up: pulls pydantic and yaml

    names = experiments or [str(p) for p in list_experiments(include_bases=True)]
    results = [variant for name in names for variant in load_experiments(name)]  # a sweep: every variant
    if as_json:
        emit_json([{"name": r.name, "hash": r.hash, "valid": True} for r in results])
        return
    for resolved in results:
        console.print(f"ok  {resolved.name}  {resolved.short_hash}")


@app.command("register")
def register_cmd(
    experiments: Annotated[list[str] | None, typer.Argument(help="Names or paths; default: every shipped experiment.")] = None,
    as_json: options.Json = False,
) -> None:
    """Validate all given specs, then record their versions in the store (nothing is written if any is bad)."""
    from ground.spec import list_experiments, load_experiments  # start-up: pulls pydantic and yaml
    from idmctl.record.specs import register_specs  # start-up: pulls sqlalchemy and pydantic

    names = experiments or [str(p) for p in list_experiments()]
    results = [variant for name in names for variant in load_experiments(name)]  # a sweep: every variant
    new = register_specs(results)
    if as_json:
        emit_json([{"name": r.name, "hash": r.hash, "new": r.hash in new} for r in results])
        return
    for resolved in results:
        marker = "new" if resolved.hash in new else "known"
        console.print(f"{marker:5s} {resolved.name}  {resolved.short_hash}")


@app.command("diff")
def diff_cmd(
    a: Annotated[str, typer.Argument(help="First experiment.")],
    b: Annotated[str, typer.Argument(help="Second experiment.")],
    as_json: options.Json = False,
) -> None:
    """Fields (and derived values) that differ between two resolved specs."""
    from ground.spec import load_spec  # start-up: pulls pydantic and yaml
    from idmctl.record.specs import derived_values  # start-up: pulls sqlalchemy and pydantic

    left, right = load_spec(a), load_spec(b)
    flat_left = {**flatten(left.canonical), **flatten({"derived": derived_values(left.spec)})}
    flat_right = {**flatten(right.canonical), **flatten({"derived": derived_values(right.spec)})}
    keys = sorted(set(flat_left) | set(flat_right))
    changes = [
        {"field": key, left.name: flat_left.get(key), right.name: flat_right.get(key)}
        for key in keys
        if flat_left.get(key) != flat_right.get(key)
    ]
    if as_json:
        emit_json(changes)
        return
    if not changes:
        console.print(f"{left.name} and {right.name} resolve to the same spec ({left.short_hash})")
        return
    table = make_table("field", left.name, right.name)
    for change in changes:
        table.add_row(change["field"], _show(change[left.name]), _show(change[right.name]))
    console.print(table)


def _show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


