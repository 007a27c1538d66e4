"""Errors a user can fix, and the exit codes of the CLI contract.

Exit codes: 0 ok, 1 a check or a job failed, 2 bad input. Bad input is reported as one line,
``error: <file>:<field>: <what> (<hint>)``, with no traceback unless ``--debug``.
"""

from __future__ import annotations

import unicodedata

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Bad input: reported as one line naming the file, the field, what is wrong and the fix."""

    def __init__(self, what: str, *, file: str | None = None, field: str | None = None, hint: str | None = None):
        super().__init__(what)
        self.what = what
        self.file = file
        self.field = field
        self.hint = hint

    def line(self) -> str:
        # Each part of the place is clipped on its own, so a 5,000-character name still leaves "file:field:";
        # one with blanks at its ends is quoted, so a name " " is seen.
        where = ":".join(clip(part if part.strip() == part else repr(part), MAX_WHERE)
                         for part in (self.file, self.field) if part)
        text = f"{where}: {self.what}" if where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return one_line(f"error: {text}")


MAX_LINE = 800
"""An error line is read by a person on one terminal line or two: a value shown in full once made one
line of 90 KB. Longer lines keep their start and end (file and field first, the fix last)."""


def visible(text: str) -> str:
    """``text`` with every control, format (zero-width, bidi) and separator character other than a plain
    space written as an escape (``\\u200b``), so a key or value that looks right on screen shows what differs."""
    out = []
    for char in text:
        category = unicodedata.category(char)
        if char != " " and (category[0] == "C" or category in ("Zl", "Zp", "Zs")):
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:
            out.append(char)
    return "".join(out)


MAX_WHERE = 200
"""The file or the field of an error line, at most: the line must keep room for what is wrong and the fix."""


def clip(text: str, limit: int) -> str:
    """``text`` of at most ``limit`` characters: its start and end, and how much was cut between them."""
    if len(text) <= limit:
        return text
    keep = max((limit - 30) // 2, 1)
    return f"{text[:keep]}…[{len(text) - 2 * keep:,} cut]…{text[-keep:]}"


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """A message as the contract prints it: one line, invisible characters escaped, no credential from
    the environment, at most ``limit`` characters (the middle is cut, and says how much)."""
    from ground.redact import scrub_environment

    return clip(visible(scrub_environment(text)), limit)


class CheckFailed(Exception):
    """A check or a job failed (exit 1); the message has already been shown to the user."""
