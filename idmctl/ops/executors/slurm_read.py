"""Reading what Slurm's tools print, the way Slurm means it, across releases (20.11 to 25.11).

- sacct/squeue print times in the local time zone of the process that runs them, and read ``-S``/``-E``
  in it too: a moment goes to sacct as local wall time (:func:`sacct_time`), never as UTC.
- ``Unknown``, ``None``, ``N/A`` and an empty field mean "not known", never a value: a Reason of
  ``None`` is no reason, an End of ``Unknown`` no end.
- What cannot be read (a field idmctl does not know, a truncated line, a time it cannot parse) is
  noted and said once per command and field (:class:`ReadNotes`): the job it concerns is left as it
  was, never guessed, never a traceback.
- Big answers come in bounded calls (:func:`run_bounded`): a record cap and a deadline per call.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone

from idmctl.core.notice import warn

NOT_KNOWN = frozenset({"", "Unknown", "None", "NONE", "N/A", "(null)", "None assigned"})
"""What Slurm prints for a value it does not have."""


@dataclass
class ReadNotes:
    """What could not be read from one command's answer, said once per (command, field)."""

    command: str
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)
    """field → (how many times, first value seen)."""
    total: int = 0
    """Notes taken so far (a reader compares it before and after a line)."""

    def note(self, name: str, value: str) -> None:
        count, first = self.seen.get(name, (0, value))
        self.seen[name] = (count + 1, first)
        self.total += 1

    def say(self) -> list[str]:
        """One warning line per field, naming the command, the field and the first value; returns them."""
        lines = [f"warning: {self.command}: {count} line{'s' if count > 1 else ''} with an unreadable {name} "
                 f"(first: {first[:80]!r}); those jobs are kept as they were"
                 for name, (count, first) in sorted(self.seen.items())]
        for line in lines:
            warn(line)
        return lines


def parse_time(text: str, notes: ReadNotes | None = None, name: str = "time") -> datetime | None:
    """A time sacct/squeue printed → aware UTC. Without a zone it is the local time of the process that
    ran the tool (this one's); with one (``Z``, ``+01:00``: some wrappers and newer JSON print it) that
    zone. ``Unknown``/``None``/``N/A`` mean not (yet) known."""
    text = text.strip()
    if text in NOT_KNOWN:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        if notes is not None:
            notes.note(name, text)
        return None
    return moment.astimezone(timezone.utc)  # naive: local time (astimezone assumes the process's zone)


def sacct_time(moment: datetime) -> str:
    """A moment as sacct reads ``-S``/``-E``: local wall time without a zone. A naive moment is UTC
    (idmctl's own convention); passing its UTC digits would open the window hours late west of Greenwich."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return aware.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def known(text: str) -> str | None:
    """A printed value, or None where Slurm printed one of its words for "not known"."""
    text = text.strip()
    return None if text in NOT_KNOWN else text


def slurm_env() -> dict[str, str]:
    """The environment for a Slurm tool, with its printed times in ISO form: a user's
    ``SLURM_TIME_FORMAT`` (``relative``, ``%s``: seen as epoch seconds in neilmunday/slurm-mail#38) would
    otherwise change what every time field says."""
    env = os.environ.copy()
    env["SLURM_TIME_FORMAT"] = "standard"
    return env


class TooManyRecords(Exception):
    """An answer longer than the call's record cap: the caller asks again for a smaller window."""


class CallDeadline(Exception):
    """A call that ran past its deadline: the caller asks again for a smaller window."""


def run_bounded(args: list[str], max_lines: int, deadline_s: float) -> str:
    """Run a Slurm tool and read its answer line by line: more than ``max_lines`` lines or longer than
    ``deadline_s`` and the tool is stopped (TooManyRecords / CallDeadline), so no answer, however big
    the cluster's history, is held in memory whole. A non-zero exit raises CalledProcessError with stderr."""
    import threading  # only for a bounded call

    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=slurm_env()) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        expired = threading.Event()

        def stop() -> None:  # the deadline also holds while the tool prints nothing
            expired.set()
            proc.kill()

        timer = threading.Timer(deadline_s, stop)
        timer.start()
        lines: list[str] = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if len(lines) > max_lines:
                    proc.kill()
                    raise TooManyRecords(f"{args[0]} printed more than {max_lines} lines")
            proc.wait()
        finally:
            timer.cancel()
        if expired.is_set():
            raise CallDeadline(f"{args[0]} ran past its {deadline_s:g} s deadline")
        stderr = proc.stderr.read()
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, args, "".join(lines), stderr)
    return "".join(lines)
