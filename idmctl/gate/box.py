"""The box: the team's code runs in a child process, never in idmctl's own.

Introspection imports the team's modules and the smoke runs the team's entry. A module whose import
sleeps would hang the preflight; one that calls ``sys.exit(3)`` would make ``idmctl`` exit 3 with no
output; one that calls ``os._exit(0)`` would make it exit 0, which a script reads as a pass. In the box:

- **a child process**: :func:`call` forks (the child runs the very check function on the very in-memory
  spec, and whatever a test patched) and :func:`command` starts a program;
- **its own session** (``setsid``), marked by a token in its environment (``IDMCTL_BOX``) that every
  process it starts inherits; at the deadline, and after it ends, the whole tree is ended: its process
  group, every descendant found in ``/proc``, and every process carrying the token (a grandchild that
  started a session of its own and whose parent has gone is found by the token alone);
- **bounded output**: only the last :data:`OUTPUT_TAIL` bytes of stdout and stderr are kept (plus, for a
  command, the lines starting with a marker the caller reads, up to :data:`MARKED_LINES`);
- **a result reported back**: :func:`call`'s function returns a JSON value written to a pipe; nothing from
  the child is unpickled in idmctl's process;
- **facts, not idmctl's exit**: how the child ended (its exit status, the signal that killed it, the
  deadline) is returned as :class:`Boxed`, for the check to report in one line.

Cost: one fork and two pipes per call; measured in ``bench/box_cost.py`` (runbook, bad input).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BOX_ENV = "IDMCTL_BOX"
"""The token every process of one box carries in its environment."""
OUTPUT_TAIL = 64 * 1024
"""Bytes of the child's stdout (and of its stderr) kept: the end, where the error is."""
MARKED_LINES = 10_000
"""Lines starting with a caller's marker kept whatever else the child prints (the smoke's step lines)."""
REPORT_LIMIT = 16 * 1024 * 1024
"""Bytes of result accepted from a child: beyond this the result is refused, not read into memory."""
_PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05
"""How often a running program is asked whether it has ended while its pipes are quiet."""


@dataclass(frozen=True)
class Boxed:
    """How the boxed child ended, and what it said."""

    value: Any = None
    """The JSON value the function returned (None when it did not report)."""
    reported: bool = False
    """Whether the function ran to its end and reported ``value``."""
    fact: str = ""
    """One line when it did not report: ``exit status 3``, ``killed by signal SIGSEGV``, ``no report within
    120 s (killed at the deadline)``, ``sys.exit(3) at teampkg/data.py:2``, ``raised RuntimeError: …``."""
    returncode: int | None = None
    """The child's exit status (negative: the signal), as ``subprocess`` gives it."""
    timed_out: bool = False
    stdout: str = ""
    """The last :data:`OUTPUT_TAIL` bytes (both streams, for :func:`call`)."""
    stderr: str = ""
    marked: list[str] = field(default_factory=list)
    """Every line starting with one of :func:`command`'s ``markers``, in order."""
    progress: str = ""
    """The last step :func:`progress` announced before the child stopped (what hung or exited)."""
    seconds: float = 0.0


class _Tail:
    """The last ``limit`` bytes of a stream, plus its complete lines that start with ``markers``."""

    def __init__(self, limit: int = OUTPUT_TAIL, markers: tuple[str, ...] = ()) -> None:
        self.limit, self.markers = limit, tuple(m.encode() for m in markers)
        self.data, self.partial, self.marked = bytearray(), bytearray(), []  # type: ignore[var-annotated]

    def feed(self, chunk: bytes) -> None:
        self.data += chunk
        del self.data[:-self.limit]
        if not self.markers:
            return
        self.partial += chunk
        *lines, rest = bytes(self.partial).split(b"\n")
        self.partial = bytearray(rest[-self.limit:])
        for line in lines:
            stripped = line.strip()
            if stripped.startswith(self.markers) and len(self.marked) < MARKED_LINES:
                self.marked.append(stripped.decode("utf-8", "replace"))

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", "replace")


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def ended(returncode: int) -> str:
    """``exit status 3`` / ``killed by signal SIGKILL``: how a process ended, as one phrase."""
    return f"killed by signal {signal_name(-returncode)}" if returncode < 0 else f"exit status {returncode}"


# -- ending a whole box ---------------------------------------------------------------------------------

def _processes() -> dict[int, int]:
    """pid → parent pid of every live process ``/proc`` shows (a zombie has ended: nothing to kill)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                state, parent = handle.read().rsplit(b")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != b"Z":
            out[int(entry.name)] = int(parent)
    return out


def _marked(token: str) -> list[int]:
    """Processes of this user whose environment carries the box's token."""
    needle = f"{BOX_ENV}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _descendants(pid: int, table: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in table.items():
        children.setdefault(parent, []).append(child)
    out, todo = [], list(children.get(pid, []))
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def end_box(pid: int | None, token: str, rounds: int = 5) -> int:
    """Stop, then kill, the box's leader ``pid`` (None: already reaped), its process group, its descendants
    and every process carrying ``token``; repeated while new ones appear (a fork racing the kill). Returns
    how many processes were signalled."""
    total = 0
    for _ in range(rounds):
        table = _processes()
        victims = set(_marked(token))
        if pid is not None:
            victims.update(p for p in [pid, *_descendants(pid, table)] if p in table)
        victims.discard(os.getpid())
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not victims:
            return total
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # frozen first: no new fork between listing and killing
            for victim in victims:
                try:
                    os.kill(victim, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        total += len(victims)
        time.sleep(0.01)
    return total


# -- a function in a forked child -------------------------------------------------------------------------

_PROGRESS_FD: list[int] = []


def progress(step: str) -> None:
    """Inside :func:`call`: announce the step about to run (``importing teampkg.data``), so a child that
    hangs or exits during it is reported by name. Outside a box: nothing."""
    if _PROGRESS_FD:
        _write(_PROGRESS_FD[0], json.dumps({"progress": step}).encode() + b"\n")


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _where_exited(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return f" at {last.filename}:{last.lineno}" if last else ""


def _child(function: Callable[[], Any], report_fd: int, output_fd: int, token: str) -> None:
    """The forked child: never returns into the caller's code, never runs its atexit handlers."""
    code = 0
    try:
        os.setsid()
        try:  # orphans of the team's code are reparented here, so the box can still find them
            import ctypes

            ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        os.environ[BOX_ENV] = token
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        # The caller may have replaced sys.stdout (a test runner): the team's prints go to the box's pipe.
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        _PROGRESS_FD[:] = [report_fd]
        try:
            message: dict[str, Any] = {"value": function()}
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) or exc.code is None else repr(exc.code)
            message = {"fact": f"sys.exit({status if status is not None else ''}){_where_exited(exc)}"}
        except BaseException as exc:  # noqa: BLE001 — the team's code may raise anything; it is a fact
            message = {"fact": f"raised {type(exc).__name__}: {exc}{_where_exited(exc)}"}
        try:
            payload = json.dumps(message, default=str).encode()
        except (TypeError, ValueError) as exc:
            payload = json.dumps({"fact": f"its result is not JSON: {exc}"}).encode()
        _write(report_fd, payload + b"\n")
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        os._exit(code)


def call(function: Callable[[], Any], deadline_s: float) -> Boxed:
    """``function()`` in a forked child in its own session, ended at ``deadline_s``; its JSON result."""
    started = time.monotonic()
    token = uuid.uuid4().hex
    report_r, report_w = os.pipe()
    output_r, output_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (report_r, report_w, output_r, output_w):
            os.close(fd)
        return Boxed(fact=f"the box could not start: {exc.strerror or exc}", seconds=time.monotonic() - started)
    if pid == 0:
        os.close(report_r)
        os.close(output_r)
        _child(function, report_w, output_w, token)
    os.close(report_w)
    os.close(output_w)
    report, output = bytearray(), _Tail()
    open_fds = {report_r, output_r}
    deadline = started + deadline_s
    timed_out = oversized = False
    finished = False
    try:
        # Until the report pipe closes (the child has ended): the output pipe may stay open for as long as
        # something the child started holds it.
        while report_r in open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(list(open_fds), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                elif fd == output_r:
                    output.feed(chunk)
                elif len(report) + len(chunk) > REPORT_LIMIT:
                    oversized = True
                    open_fds.clear()
                else:
                    report += chunk
        _drain(output_r, output, open_fds)
        finished = True
    finally:
        if timed_out or oversized or not finished:  # not finished: interrupted (Ctrl-C); the box goes too
            end_box(pid, token)
            if not finished:
                os.waitpid(pid, 0)
        os.close(report_r)
        os.close(output_r)
    _, status = os.waitpid(pid, 0)
    end_box(None, token)  # what the child left behind (a daemon its import started)
    returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    steps, final = [], None
    for line in bytes(report).splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and "progress" in message:
            steps.append(str(message["progress"]))
        elif isinstance(message, dict):
            final = message
    seconds = time.monotonic() - started
    common = dict(returncode=returncode, stdout=output.text(), progress=steps[-1] if steps else "", seconds=seconds)
    if timed_out:
        return Boxed(fact=f"no report within {deadline_s:g} s (killed at the deadline)", timed_out=True, **common)
    if oversized:
        return Boxed(fact=f"a report over {REPORT_LIMIT} bytes (refused, the child killed)", **common)
    if final is not None and "value" in final:
        return Boxed(value=final["value"], reported=True, **common)
    if final is not None and "fact" in final:
        return Boxed(fact=str(final["fact"]), **common)
    return Boxed(fact=f"{ended(returncode)} before reporting a result", **common)


# -- a program ------------------------------------------------------------------------------------------

def command(argv: list[str], *, env: dict[str, str], cwd: Path | str, deadline_s: float,
            markers: tuple[str, ...] = ()) -> Boxed:
    """Run ``argv`` in its own session, stdin from /dev/null, output bounded, ended at ``deadline_s``
    with everything it started. ``returncode``, ``timed_out``, ``stdout``/``stderr`` (tails) and
    ``marked`` (lines starting with ``markers``) say what happened; ``reported`` is True when it exited
    by itself. OSError when it cannot start."""
    started = time.monotonic()
    token = uuid.uuid4().hex
    child = subprocess.Popen(argv, cwd=cwd, env={**env, BOX_ENV: token}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert child.stdout is not None and child.stderr is not None
    streams = {child.stdout.fileno(): _Tail(markers=markers), child.stderr.fileno(): _Tail()}
    open_fds = set(streams)
    deadline = started + deadline_s
    timed_out = False
    try:
        # Until the program has ended: its pipes may stay open for as long as something it started holds them.
        while child.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not open_fds:  # both pipes at EOF: only the exit is left to wait for
                try:
                    child.wait(timeout=min(left, POLL_S))
                except subprocess.TimeoutExpired:
                    pass
                continue
            ready = select.select(list(open_fds), [], [], min(left, POLL_S))[0]
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    streams[fd].feed(chunk)
                else:
                    open_fds.discard(fd)
        for fd in list(open_fds):
            _drain(fd, streams[fd], open_fds)
    finally:
        if timed_out or child.poll() is None:
            end_box(child.pid, token)
        child.wait()
        end_box(None, token)  # a grandchild in a session of its own outlives neither the deadline nor the entry
        child.stdout.close()
        child.stderr.close()
    stdout_tail, stderr_tail = _texts(streams)
    marked = next(iter(streams.values())).marked
    fact = (f"no end within {deadline_s:g} s (killed at the deadline with everything it started)" if timed_out
            else "" if child.returncode == 0 else ended(child.returncode))
    return Boxed(reported=not timed_out, fact=fact, returncode=child.returncode, timed_out=timed_out,
                 stdout=stdout_tail, stderr=stderr_tail, marked=marked, seconds=time.monotonic() - started)


def _drain(fd: int, tail: _Tail, open_fds: set[int], grace_s: float = 0.2) -> None:
    """What is already in the pipe once the writer we waited for has ended (another holder may never close it)."""
    until = time.monotonic() + grace_s
    while fd in open_fds and select.select([fd], [], [], max(until - time.monotonic(), 0))[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            open_fds.discard(fd)
            return
        tail.feed(chunk)


def _texts(streams: dict[int, _Tail]) -> tuple[str, str]:
    tails = list(streams.values())
    return tails[0].text(), tails[1].text()
