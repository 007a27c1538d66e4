"""The job script's template: ``templates/job.sh.tmpl`` read once, its parts filled with ``{{name}}`` values.

Plain substitution, no template language: what varies between jobs is decided in ``render.py`` (which
part, which values), the bash itself lives in the template file. A line that is only ``{{name}}`` takes
a block of lines and vanishes when the block is empty, so an optional block leaves no blank line.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

TEMPLATE = Path(__file__).parent / "templates" / "job.sh.tmpl"
"""Shipped as package data (pyproject's ``[tool.setuptools.package-data]``)."""

_PART = re.compile(r"^#== ([a-z_]+) ==$", re.MULTILINE)
_SLOT = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")


@cache
def parts(path: Path = TEMPLATE) -> dict[str, str]:
    """The template's parts by name, each without the blank lines that separate it from the next."""
    pieces = _PART.split(path.read_text())
    return {name: body.strip("\n") for name, body in zip(pieces[1::2], pieces[2::2])}


def slots(text: str) -> set[str]:
    """The names a part (or a whole template) asks for."""
    return set(_SLOT.findall(text))


def fill(part: str, values: dict[str, object], path: Path | None = None) -> str:
    """Part ``part`` of the template at ``path`` (default :data:`TEMPLATE`) with every ``{{name}}``
    replaced by ``str(values[name])``, no trailing newline. A name the part asks for and ``values``
    lacks is a KeyError naming it (a bug in the renderer)."""
    lines = []
    for line in parts(path or TEMPLATE)[part].split("\n"):
        whole = _SLOT.fullmatch(line)
        if whole is not None:
            block = str(values[whole.group(1)])
            if block:
                lines.append(block)
            continue
        lines.append(_SLOT.sub(lambda m: str(values[m.group(1)]), line))
    return "\n".join(lines)
