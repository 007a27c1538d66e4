"""How commands report: rich tables for people, ``--json`` for programs, errors on stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def _width() -> int | None:
    """Terminal width on a TTY; wide enough for every table when piped (tests, logs, CI)."""
    if os.environ.get("COLUMNS"):
        return int(os.environ["COLUMNS"])
    return None if sys.stdout.isatty() else 200


class _LazyConsole:
    """A rich ``Console`` made on first use: importing rich is ~20 ms, which a ``--json`` command (a
    submit, ``failures --json``) never needs (issue 15). Its settings are fixed when this module is
    imported, as they were when the console itself was made here."""

    def __init__(self, **settings: Any) -> None:
        self._settings = settings
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._settings)
        return getattr(self._console, name)


console: Console = _LazyConsole(highlight=False, soft_wrap=False, width=_width())  # type: ignore[assignment]
err_console: Console = _LazyConsole(stderr=True, highlight=False, soft_wrap=True, width=_width())  # type: ignore[assignment]


def emit_json(data: Any) -> None:
    """One JSON document on stdout (no rich markup, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def emit_json_rows(rows: list[Any]) -> None:
    """A JSON list with one compact element per line. ``indent`` makes json use its pure-Python encoder
    (~70 ms for `failures --json`'s 2,000 rows); per-row dumps stay in the C encoder (~10 ms)."""
    body = ",\n".join(json.dumps(row, default=str) for row in rows)
    sys.stdout.write(f"[\n{body}\n]\n" if rows else "[]\n")
    sys.stdout.flush()


def make_table(*columns: str, title: str | None = None) -> "Table":
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table
