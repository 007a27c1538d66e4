"""A run directory's event record: when the trainer started working and when each checkpoint landed.

The trainer (rank 0) appends one JSON line per event to ``RUN_DIR/events.jsonl``; ``idmctl ledger``
reads it to split a failed run's GPU-hours into work that reached a checkpoint a later run resumed
from, and what was lost (stage-in before ``start``, work after the last ``checkpoint``). The times are
measured where they happen, on the node; Slurm's run start and end come from sacct.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ground.contract import EVENT_MARKER, EVENTS_FILE

START = "start"
"""The trainer began: stage-in and interpreter start are over."""
CHECKPOINT = "checkpoint"
"""A complete checkpoint is in place (renamed from its temp file)."""
CHECKPOINT_CORRUPT = "checkpoint_corrupt"
"""Resume found a checkpoint whose manifest is missing or not JSON, or a file whose size or sha256 is not
the manifest's: moved aside to ``checkpoints/corrupt/``, never loaded."""
CHECKPOINT_UNLOADABLE = "checkpoint_unloadable"
"""A checkpoint whose files match its manifest failed to load (the error is the evidence): moved aside."""
CHECKPOINT_UNVERIFIED = "checkpoint_unverified"
"""Resume loaded a single-file checkpoint written before manifests existed: nothing could be verified."""


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """One line, written with a single O_APPEND write: lines of concurrent attempts never interleave."""
    line = json.dumps({"event": event, "at": datetime.now(timezone.utc).isoformat(), **fields}) + "\n"
    fd = os.open(Path(run_dir) / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def event_line(event: str, **fields: Any) -> str:
    """``IDMCTL_EVENT event=<event> key=value …``: values shell-quoted, so a path or an error with spaces
    stays one field (:func:`parse_event_line` reads it back)."""
    parts = [f"event={shlex.quote(event)}"]
    parts += [f"{key}={shlex.quote(str(value))}" for key, value in fields.items() if value is not None]
    return f"{EVENT_MARKER} {' '.join(parts)}"


def parse_event_line(line: str) -> dict[str, str] | None:
    """The fields of an :func:`event_line` (``event`` among them); None for any other line or a torn one."""
    if not line.startswith(EVENT_MARKER + " "):
        return None
    try:
        tokens = shlex.split(line[len(EVENT_MARKER) + 1:])
    except ValueError:
        return None
    fields = dict(token.partition("=")[::2] for token in tokens if "=" in token)
    return fields if "event" in fields else None


def record_event(run_dir: Path, event: str, **fields: Any) -> None:
    """An event both places it is read: a JSON line of ``events.jsonl`` and an ``IDMCTL_EVENT`` line on
    stderr (the job log)."""
    append_event(run_dir, event, **{key: value for key, value in fields.items() if value is not None})
    print(event_line(event, **fields), file=sys.stderr, flush=True)


def read_events(run_dir: Path) -> list[tuple[str, datetime]]:
    """(event, UTC time) in file order; [] when there is no record. A torn last line is skipped."""
    try:
        text = (Path(run_dir) / EVENTS_FILE).read_text()
    except OSError:
        return []
    events = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            events.append((str(entry["event"]), datetime.fromisoformat(entry["at"]).astimezone(timezone.utc)))
        except (ValueError, KeyError, TypeError):
            continue
    return events
