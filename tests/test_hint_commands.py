"""Every `idmctl ...` command a message, hint or doc string names exists (a "no job" hint once named
`idmctl jobs sync`, which does not exist)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"`idmctl ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)")


def _named_commands() -> dict[str, str]:
    found: dict[str, str] = {}
    for folder in ("idmctl", "ground", "cache", "trainers"):
        for path in (REPO / folder).rglob("*.py"):
            for match in NAMED.finditer(path.read_text()):
                found.setdefault(match.group(1), f"{path.relative_to(REPO)}")
    return found


def test_every_command_named_in_the_code_exists(cli) -> None:
    named = _named_commands()
    assert len(named) > 10, named
    missing = []
    for words, where in sorted(named.items()):
        first, *rest = words.split()
        top = cli(first, "--help")
        if top.exit_code != 0:
            missing.append(f"{words} ({where})")
            continue
        if rest and "Commands" in top.output and cli(first, rest[0], "--help").exit_code != 0:
            missing.append(f"{words} ({where})")
    assert not missing, f"named but not a command: {missing}"
