"""``idmctl quickstart``: the whole loop on embedded defaults, in one command (see ``idmctl.quickstart``)."""

from __future__ import annotations


def quickstart() -> None:
    """demos → hidden cache → preflight with smoke → submit → train → eval (offline + simulator) → compare.

    Runs on this machine: SQLite store, local executor (or Slurm when IDMCTL_CLUSTER names it),
    MLflow SQLite store, all under $IDMCTL_HOME. Re-running reuses the demos and the cache.
    """
    from idmctl.quickstart import run_quickstart

    run_quickstart()
