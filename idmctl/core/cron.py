"""A scrontab schedule judged before it reaches Slurm: five cron fields, each ``*``, a number, a range
``a-b`` or a list of those, each with an optional step ``/n``, every number inside its field's range
(scrontab(1): minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-7, 0 and 7 Sunday).
Month and day names are not taken: one spelling, the numeric one, so what idmctl checked is what Slurm reads.
"""

from __future__ import annotations

import re

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
"""(name, lowest, highest) of each cron field, in order."""
_ITEM = re.compile(r"^(?:(\*)|(\d{1,2})(?:-(\d{1,2}))?)(?:/(\d{1,2}))?$")


def schedule_problem(text: str) -> str | None:
    """Why ``text`` is not a schedule scrontab runs as written (None: it is one)."""
    if not isinstance(text, str) or any(c in text for c in "\n\r;`$%#\\"):
        return "five cron fields, e.g. '*/10 * * * *'"
    parts = text.split()
    if len(parts) != len(FIELDS):
        return f"five cron fields, e.g. '*/10 * * * *' (got {len(parts)})"
    for part, (name, low, high) in zip(parts, FIELDS):
        for item in part.split(","):
            match = _ITEM.match(item)
            if match is None:
                return f"cron {name} field {part!r}: use *, a number, a range a-b or a list, each with an optional /step"
            star, first, last, step = match.groups()
            if step is not None and int(step) == 0:
                return f"cron {name} field {part!r}: a step of 0 never fires"
            if star:
                continue
            begin, end = int(first), int(last if last is not None else first)
            for value in (begin, end):
                if not low <= value <= high:
                    return f"cron {name} {value} is outside {low}-{high}"
            if end < begin:
                return f"cron {name} range {begin}-{end} runs backwards"
    return None
