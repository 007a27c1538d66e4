"""The line a traceback comes down to: ``file:line in func → ExcType: message``, for a smoke or a build
that failed in a subprocess (the smoke, the entry smoke and the build smoke all report it)."""

from __future__ import annotations

import re
from pathlib import Path

from ground.paths import REPO_ROOT

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b.*|^[A-Za-z_][\w.]*: .+")


def last_frame_and_exception(stderr: str, prefer: list[Path] | None = None) -> str:
    """``file:line in func → ExcType: message`` from a Python traceback; the last lines otherwise. With
    ``prefer`` (the code's own folders), the innermost frame inside them: the team's line that called
    into torch (job 6262's DataLoader call), not torch's line that raised; shown relative to its folder."""
    lines = stderr.rstrip().splitlines()
    frame = None
    base = REPO_ROOT
    for line in lines:
        match = _FRAME.match(line)
        if not match:
            continue
        if prefer:
            owner = next((root for root in prefer if Path(match["file"]).resolve().is_relative_to(root.resolve())), None)
            if owner is None and frame is not None:
                continue
            base = owner or base
        frame = match
    exception = next((line.strip() for line in reversed(lines) if _EXCEPTION.match(line.strip())), None)
    if frame is None and exception is None:
        return " | ".join(line.strip() for line in lines[-3:]) or "no output"
    where = ""
    if frame is not None:
        path = Path(frame["file"])
        try:
            path = path.resolve().relative_to(base.resolve())
        except ValueError:
            pass
        where = f"{path}:{frame['line']} in {frame['func']} → "
    return f"{where}{exception or lines[-1].strip()}"
