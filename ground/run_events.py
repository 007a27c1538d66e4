"""A run directory's event record: when the trainer started working and when each checkpoint landed.

The trainer (rank 0) appends one JSON line per event to ``RUN_DIR/events.jsonl``; ``idmctl ledger``
reads it to split a failed run's GPU-hours into work that reached a checkpoint a later run resumed
from, and what was lost (stage-in before ``start``, work after the last ``checkpoint``). The times are
measured where they happen, on the node; Slurm's run start and end come from sacct.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ground.contract import EVENTS_FILE

START = "start"
"""The trainer began: stage-in and interpreter start are over."""
CHECKPOINT = "checkpoint"
"""A complete checkpoint is in place (renamed from its temp file)."""


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """One line, written with a single O_APPEND write: lines of concurrent attempts never interleave."""
    line = json.dumps({"event": event, "at": datetime.now(timezone.utc).isoformat(), **fields}) + "\n"
    fd = os.open(Path(run_dir) / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


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
