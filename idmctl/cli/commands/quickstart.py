"""``idmctl quickstart``: the whole loop on embedded defaults, in one command (see ``idmctl.cli.quickstart``)."""

from __future__ import annotations

from typing import Annotated

import typer


def quickstart(
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback when a stage fails.")] = False,
) -> None:
    """doctor → demos → hidden cache → preflight with smoke → submit → train → eval (offline + simulator) → compare.

    Runs on this machine: SQLite store, local executor (or Slurm when IDMCTL_CLUSTER names it),
    MLflow SQLite store, all under $IDMCTL_HOME. Re-running reuses the demos and the cache. A failing
    stage ends in one line saying what failed and what to do.
    """
    from idmctl.cli.app import debug_on, set_debug  # start-up: only this command needs it (5 more project modules)
    from idmctl.cli.quickstart import run_quickstart  # start-up: pulls pydantic and yaml

    if debug:
        set_debug()
    run_quickstart(debug=debug_on())
