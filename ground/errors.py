"""Errors a user can fix, and the exit codes of the CLI contract.

Exit codes: 0 ok, 1 a check or a job failed, 2 bad input. Bad input is reported as one line,
``error: <file>:<field>: <what> (<hint>)``, with no traceback unless ``--debug``.
"""

from __future__ import annotations

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
        where = ":".join(part for part in (self.file, self.field) if part)
        text = f"{where}: {self.what}" if where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return f"error: {text}"


class CheckFailed(Exception):
    """A check or a job failed (exit 1); the message has already been shown to the user."""
