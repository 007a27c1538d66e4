"""``idmctl quickstart``: the main loop on embedded defaults, in one command.

Today: validate every shipped experiment and register their versions in the store. Each stage of the
loop (demos → cache → preflight → submit → train → eval → compare) joins as it lands.
"""

from __future__ import annotations

from idmctl.output import console
from idmctl.paths import home
from idmctl.spec import list_experiments, load_spec
from idmctl.spec.registry import register_specs


def quickstart() -> None:
    """Run the daily loop end to end on this machine (SQLite store, local executor, MLflow SQLite)."""
    console.print(f"[bold]idmctl quickstart[/bold]  IDMCTL_HOME={home()}")
    specs = [load_spec(str(path)) for path in list_experiments()]
    new = register_specs(specs)
    console.print(f"[1/1] specs: {len(specs)} experiments valid, {len(new)} new versions registered")
    for resolved in specs:
        console.print(f"      {resolved.name:20s} {resolved.short_hash}  {resolved.spec.description}")
