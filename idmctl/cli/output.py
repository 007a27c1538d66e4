"""How commands report: rich tables for people, ``--json`` for programs, errors on stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any
from ground.redact import scrub_environment

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
    submit, ``failures --json``) never needs. Its settings are fixed when this module is
    imported, as they were when the console itself was made here."""

    def __init__(self, scrub: bool = False, **settings: Any) -> None:
        self._settings = settings
        self._console: Console | None = None
        self._scrub = scrub

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Rich's print; on stderr, text is first scrubbed of the environment's credentials (warnings quote
        exceptions from MLflow and drivers, which may hold a tracking or store URL with its password)."""
        if self._scrub:

            objects = tuple(scrub_environment(o) if isinstance(o, str) else o for o in objects)
        self.__getattr__("print")(*objects, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._settings)
        return getattr(self._console, name)


# markup=False: what is printed is mostly values from a user, a file or a log (descriptions, paths,
# failure evidence), and Rich read `[/x]` in one as a closing tag and raised MarkupError mid-command.
# Styles are given as objects instead (:func:`styled`), never parsed out of a string; a table cell
# that is a str is printed as it is too (Rich renders cells with the console's markup setting).
console: Console = _LazyConsole(highlight=False, soft_wrap=False, width=_width(), markup=False)  # type: ignore[assignment]
err_console: Console = _LazyConsole(scrub=True, stderr=True, highlight=False, soft_wrap=True, width=_width(), markup=False)  # type: ignore[assignment]

STATUS_STYLE = {"PASS": "green", "OK": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}
"""How a check's status is coloured in every table (preflight, sweeps, doctor)."""


def styled(text: Any, style: str | None = None) -> Any:
    """A table cell printed literally in ``style`` (a status's colour when none is given)."""
    from rich.text import Text

    value = str(text)
    return Text(value, style=style or STATUS_STYLE.get(value.split(" ", 1)[0], ""))


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
