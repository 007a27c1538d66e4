"""Reading a job log's end: what sync stores, what the classifier reads, what ``failures explain`` is given.

One reader for all three, bounded whatever the file: a 1 GB log or one 10 MB line costs one seek and
``max_bytes`` read; bytes that are not UTF-8 become U+FFFD instead of an error. ANSI colours, ``\\r``
progress bars and launcher prefixes are the classifier's business (``classify.log_lines``).
"""

from __future__ import annotations

from pathlib import Path

from ground.errors import UserError

LOG_TAIL_BYTES = 64_000
"""How much of a job log's end is read when the store has no tail: a traceback fits easily."""
BINARY_SAMPLE_BYTES = 8_192
"""How much of a file's start and end ``read_log_file`` looks at for NUL bytes (a log has none; a core
dump, a checkpoint or an archive does)."""


def read_log_tail(path: str | Path | None, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a job log ('' when it is missing or unreadable)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            return _tail(handle, max_bytes).decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_log_file(path: Path, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """:func:`read_log_tail` for a file a person names (``failures explain LOG``): a missing, unreadable or
    binary file is a UserError naming it, never an empty log classified ``unknown``."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(BINARY_SAMPLE_BYTES)
            data = _tail(handle, max_bytes)
    except IsADirectoryError:
        raise UserError("is a directory, not a log file", file=str(path), hint="name the job's log file") from None
    except FileNotFoundError:
        raise UserError("no such file", file=str(path), hint="name an existing log file; `idmctl jobs show JOB` prints a job's") from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", file=str(path), hint="check the path and its permissions") from None
    if b"\0" in head or b"\0" in data[-BINARY_SAMPLE_BYTES:]:
        raise UserError("is a binary file, not a log (it holds NUL bytes)", file=str(path),
                        hint="name the job's text log, its stdout/stderr file")
    return data.decode("utf-8", errors="replace")


def _tail(handle, max_bytes: int) -> bytes:  # type: ignore[no-untyped-def]
    handle.seek(0, 2)
    size = handle.tell()
    handle.seek(max(0, size - max_bytes))
    return handle.read(max_bytes)
