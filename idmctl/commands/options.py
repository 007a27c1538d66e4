"""Options and arguments many commands share, worded once so that EXP, ``--json`` and ``--cluster`` mean
the same everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

Experiment = Annotated[str, typer.Argument(help="Experiment name or YAML path.")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Cluster = Annotated[str | None, typer.Option("--cluster", help="Cluster profile (default $IDMCTL_CLUSTER or local).")]
