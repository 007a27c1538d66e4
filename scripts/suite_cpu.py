#!/usr/bin/env python3
"""Where a command's CPU time goes, by kind of process: the map for making the test suite cheaper.

    scripts/suite_cpu.py run OUT.json -- scripts/test.sh      # sample while the command runs, then report
    scripts/suite_cpu.py report OUT.json [--top 40]            # report a saved sample again

The suite is CPU-bound on two cores (both ~95 % busy), so its wall time is its CPU work ÷ 2, and that
work is mostly interpreter start-ups: a trainer process spends ~13 s of CPU here, most of it importing
torch, Fabric (torch._dynamo) and MLflow (its SQLite store). This samples every process's utime + stime
from /proc every 0.2 s and groups them by what they run (``python -m trainers.train``, ``idmctl sync``,
the pytest workers...), so a change to the suite can be judged by the CPU seconds it removes.

Only the command and its descendants count, and the Slurm jobs it ran: every ``slurmstepd`` that started
after the command did, with its children (the job scripts, trainers and builders slurmd starts, which are
no descendants of the command). Other processes on the machine (another session's, kernel threads,
daemons started before the command) are left out. Processes that start and end between two
samples are missed (they cost < 0.2 s each). Standard library only: it must run before the .venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_EVERY_S = 0.2


def _read_process(pid: str) -> tuple[str, int, str, str] | None:
    """(start time in ticks since boot, utime + stime in ticks, command line, parent pid) of one /proc entry."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])
        started = fields[19]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError, IndexError):
        return None  # ended between listdir and read, or not ours to read
    return started, ticks, command, fields[1]


def sample(until: subprocess.Popen) -> list[dict]:
    """Sample until ``until`` exits; one row per process of the command: ``until`` and its descendants (a
    process is one when its parent was seen as one; an orphan whose parent was never seen is missed), and
    each ``slurmstepd`` started after ``until`` with its descendants."""
    me = str(os.getpid())
    ours: set[str] = set()  # pids of the command and its descendants, kept when a parent exits first
    seen: dict[tuple[str, str], dict] = {}
    first = _read_process(str(until.pid))
    began = int(first[0]) if first else 0  # ticks since boot: a slurmstepd started later runs the command's jobs
    while until.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            read = _read_process(pid)
            if read is None:
                continue
            started, ticks, command, parent = read
            job_step = command.startswith("slurmstepd") and int(started) >= began
            if (pid, started) not in seen and pid != str(until.pid) and parent not in ours and not job_step:
                continue  # not a descendant of the command (another test's process on a shared machine)
            ours.add(pid)
            row = seen.setdefault((pid, started), {"pid": int(pid), "command": command, "cpu_s": 0.0})
            row["cpu_s"] = ticks / CLOCK_TICKS
            if command and row["command"] != command:
                row["command"] = command  # a fork first shows its parent's command line, then its exec's
        time.sleep(SAMPLE_EVERY_S)
    return list(seen.values())


def kind(command: str) -> str:
    """The group a command line reports under: the module or script a Python runs, else the program."""
    words = command.split()
    if not words:
        return "(no command line)"
    program = words[0].rsplit("/", 1)[-1]
    if program.startswith("python"):
        if "exec(eval(sys.stdin.readline()))" in command:
            return "pytest worker (the tests' own work)"
        module = re.search(r"(?:^|\s)-m\s+([\w.]+)", command)
        if module and module.group(1) == "idmctl":
            # The command's first word only: a second word may be a subcommand or an experiment's name.
            rest = [word for word in command.split(" -m idmctl", 1)[1].split() if not word.startswith("-")]
            return f"idmctl {rest[0]}" if rest else "idmctl"
        if module:
            return f"python -m {module.group(1)}"
        if re.search(r"(?:^|\s)-c(?:\s|$)", command):
            return "python -c …"
        script = next((word for word in words[1:] if not word.startswith("-")), "")
        return f"python {script.rsplit('/', 1)[-1]}".strip()
    if program in ("bash", "sh") and len(words) > 1:
        return f"{program} {words[1].rsplit('/', 1)[-1]}"
    return program.rstrip(":")


def report(rows: list[dict], top: int = 40) -> list[str]:
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        groups[kind(row["command"])].append(row["cpu_s"])
    total = sum(row["cpu_s"] for row in rows)
    lines = [f"CPU time of the processes the command started: {total:,.0f} s over {len(rows):,} processes",
             "", f"{'CPU s':>8} {'share':>6} {'procs':>6} {'s/proc':>7}  kind"]
    ranked = sorted(groups.items(), key=lambda item: -sum(item[1]))
    for name, times in ranked[:top]:
        spent = sum(times)
        lines.append(f"{spent:8.1f} {spent / total if total else 0:6.1%} {len(times):6d} {spent / len(times):7.2f}  {name}")
    if len(ranked) > top:
        rest = sum(sum(times) for _, times in ranked[top:])
        lines.append(f"{rest:8.1f} {rest / total if total else 0:6.1%} {'':>6} {'':>7}  ({len(ranked) - top} more kinds)")
    return lines


def _write(path: Path, rows: list[dict]) -> None:
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    temporary.write_text(json.dumps(rows))
    os.replace(temporary, path)  # a killed sampler never leaves a half-written sample that reads as whole


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="action", required=True)
    run = commands.add_parser("run", help="run COMMAND, sample its processes, write OUT and print the report")
    run.add_argument("out", type=Path)
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.add_argument("--top", type=int, default=40)
    shown = commands.add_parser("report", help="print the report of a saved sample")
    shown.add_argument("out", type=Path)
    shown.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if args.action == "report":
        try:
            rows = json.loads(args.out.read_text())
        except (OSError, ValueError) as error:
            print(f"suite_cpu: {args.out}: not a saved sample ({error}); write one with: "
                  f"scripts/suite_cpu.py run {args.out} -- COMMAND", file=sys.stderr)
            return 2
        print("\n".join(report(rows, args.top)))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("suite_cpu: run needs a command after --, e.g. scripts/suite_cpu.py run cpu.json -- scripts/test.sh",
              file=sys.stderr)
        return 2
    process = subprocess.Popen(command)
    forward = lambda signum, _frame: process.send_signal(signum)  # noqa: E731 - the command decides how to stop
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    rows = sample(process)
    _write(args.out, rows)
    print("\n".join(report(rows, args.top)), file=sys.stderr)
    return process.wait()


if __name__ == "__main__":
    sys.exit(main())
