"""Options and arguments many commands share, worded once so that EXP, ``--json`` and ``--cluster`` mean
the same everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

Experiment = Annotated[str, typer.Argument(help="Experiment name or YAML path.")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Cluster = Annotated[str | None, typer.Option("--cluster", help="Cluster profile (default $IDMCTL_CLUSTER or local).")]
UiUrl = Annotated[str, typer.Option("--ui-url", help="Where `idmctl ui` serves, for the links.")]
UI_URL = "http://127.0.0.1:5000"
"""`idmctl ui`'s default address (its --port default is 5000)."""

# Numeric domains of the flags: a value outside is Click's one-line usage error naming the flag, exit 2
# (a 20-digit id or port raised OverflowError from SQLite or bind()).
STORE_INT_MAX = 2**63 - 1
"""Ids and row counts are the store's INTEGER (SQLite's and PostgreSQL's bigint: 64-bit signed)."""
JOB_ID = {"min": 1, "max": STORE_INT_MAX}
"""``jobs show``/``cancel``: idmctl job ids start at 1."""
ROW_LIMIT = {"min": 0, "max": STORE_INT_MAX}
"""``--limit``: 0 means all rows (where a command says so); more than the store can count is a typo."""
PORT = {"min": 0, "max": 65_535}
"""``ui --port``: a TCP port (0: any free one)."""
SECONDS_MAX = 7 * 86400.0
"""``watch --interval`` and ``--smoke-timeout``: a week is longer than any sync interval or smoke run."""
INTERVAL = {"max": SECONDS_MAX}  # 0 and below: `watch` says "must be positive" itself
SMOKE_TIMEOUT = {"min": 1.0, "max": SECONDS_MAX}
PROCESSES = {"min": 1, "max": 1_024}
"""``--processes``: builder ranks on one machine (torchrun); 1,024 is past any node's GPUs or cores."""
SEED = {"min": 0, "max": 2**32 - 1}
"""``--seed``: numpy's and robosuite's seeds are 32-bit unsigned."""
COUNT = {"min": 0, "max": 1_000_000}
"""``watch --count``, demo and scene counts and steps: a million is past any demo set made here."""
FRAME_PX = {"min": 1, "max": 4_096}
"""``--camera-size``/``--size``: square frames; 4,096 px is past any camera a demo is rendered with."""
