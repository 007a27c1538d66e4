"""The hang watchdog the job script starts beside the trainer.

``python -m trainers.watchdog --run-dir DIR --trainer-pid PID --k K --floor S --poll S`` (k, floor and
poll from the cluster profile's ``hang:``; rendered by idmctl/job/render.py). Every ``poll`` seconds it
reads the heartbeat (``ground.heartbeat``: progress.json and its mtime). It arms at the first beat of
this attempt (a file left by an earlier attempt is older than the watchdog), and when the heartbeat has
not moved for longer than max(k × the measured s/step, floor) it:

1. sends SIGUSR2 to every rank (``scancel --signal=USR2`` on each job step under Slurm, the trainer's
   process tree otherwise): each rank's ``faulthandler`` writes all its threads' Python stacks into the
   job log;
2. waits ``--dump-wait`` seconds for the dumps, prints ``IDMCTL_FAILURE cause=hang node=... step=...
   silent_s=... threshold_s=...``;
3. kills the ranks with SIGKILL (the step only: the batch script lives on to exit ``EXIT_HANG``), and
   exits ``EXIT_HANG``.

Sync classifies the job ``hang``, leaves the node out and resubmits: the chain resumes from its checkpoint.

Before the first beat the heartbeat says nothing, so a hang there (a dataset build stuck on a read, NCCL's
start-up waiting for a rank that never came) would wait for Slurm's time limit. ``--start-deadline S``
gives that phase a deadline of its own: no beat of this attempt S seconds after the watchdog started is a
hang too (``phase=start`` in the marker). :func:`start_deadline_s` derives S from the plan: the stage-in
the watchdog waits through (bytes ÷ the cluster's bandwidth) plus the smoke's measured build time, times
a margin, never below a floor.
Imports only the standard library and ``ground``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ground.contract import CAUSE_HANG, EXIT_HANG, FAILURE_MARKER, STACKS_SIGNAL
from ground.heartbeat import read, start_deadline_s, threshold_s  # noqa: F401  (start_deadline_s: its home)
from ground.processes import alive


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _job_steps(job_id: str) -> list[str]:
    """The job's numbered steps (``123.0``): the ranks live there, not under the batch shell."""
    result = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], capture_output=True, text=True,
                            timeout=60)
    return [s for s in result.stdout.split() if s.split(".")[-1].isdigit()]


def signal_ranks(trainer_pid: int, signame: str) -> str:
    """Send ``signame`` to every rank; returns where it went (for the log)."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if job_id:
        steps = _job_steps(job_id)
        for step in steps:
            subprocess.run(["scancel", f"--signal={signame}", step], capture_output=True, timeout=60)
        return f"steps {','.join(steps) or 'none'}"
    pids = _descendants(trainer_pid)
    for pid in pids:
        try:
            os.kill(pid, getattr(signal, f"SIG{signame}"))
        except OSError:
            pass
    return f"pids {','.join(map(str, pids))}"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")



def watch(run_dir: Path, trainer_pid: int, k: float, floor: float, poll: float, dump_wait: float,
          start_deadline: float | None = None) -> int:
    started = time.time()
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    first = f"; the first beat within {start_deadline:g} s" if start_deadline is not None else ""
    print(f"idmctl: watchdog on {node}: hang when the heartbeat stops for max({k:g} × s/step, {floor:g} s){first}, "
          f"checked every {poll:g} s", flush=True)
    while alive(trainer_pid):
        time.sleep(poll)
        beat = read(run_dir)
        now = time.time()
        if beat is None or beat.at < started - 1:
            # Not armed: no beat of this attempt yet (stage-in, imports, a previous attempt's file).
            if start_deadline is None or now - started <= start_deadline or not alive(trainer_pid):
                continue
            return _hung(trainer_pid, node, dump_wait, silent=now - started, limit=start_deadline,
                         why=f"no heartbeat {now - started:.1f} s after start > the start-up deadline "
                             f"{start_deadline:g} s", fields=["phase=start", "step=none"])
        silent, limit = now - beat.at, threshold_s(beat, k, floor)
        if silent <= limit or not alive(trainer_pid):
            continue
        pace = f"{beat.s_per_step:.3f} s/step" if beat.s_per_step else "no step timed yet"
        return _hung(trainer_pid, node, dump_wait, silent=silent, limit=limit,
                     why=f"no heartbeat for {silent:.1f} s since step {beat.step} at {_iso(beat.at)} > max({k:g} × "
                         f"{pace}, {floor:g} s) = {limit:.1f} s",
                     fields=[f"step={beat.step}", f"last_beat={_iso(beat.at)}"],
                     after=[f"k={k:g}", f"floor_s={floor:g}",
                            f"s_per_step={beat.s_per_step:.4f}" if beat.s_per_step else "s_per_step=none"])
    return 0


def _hung(trainer_pid: int, node: str, dump_wait: float, silent: float, limit: float, why: str, fields: list[str],
          after: list[str] | None = None) -> int:
    """Dump every rank's stacks, print the hang marker, kill the ranks; returns EXIT_HANG."""
    # From here on the job script's TERM (sent when the killed trainer exits) must not cut the verdict short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"idmctl: watchdog: {why}; dumping every rank's Python stacks (SIG{STACKS_SIGNAL})", flush=True)
    where = signal_ranks(trainer_pid, STACKS_SIGNAL)
    time.sleep(dump_wait)
    print(" ".join([FAILURE_MARKER, f"cause={CAUSE_HANG}", f"node={node}", *fields, f"silent_s={silent:.1f}",
                    f"threshold_s={limit:.1f}", *(after or [])]), file=sys.stderr, flush=True)
    killed = signal_ranks(trainer_pid, "KILL")
    print(f"idmctl: watchdog: stacks requested from {where}; killed {killed}", flush=True)
    return EXIT_HANG


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainers.watchdog", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--trainer-pid", required=True, type=int)
    parser.add_argument("--k", type=float, required=True, help="Hang after k × the measured step time...")
    parser.add_argument("--floor", type=float, required=True, help="...but never sooner than this many seconds.")
    parser.add_argument("--poll", type=float, required=True, help="Seconds between heartbeat reads.")
    parser.add_argument("--dump-wait", type=float, default=1.0, help="Seconds the ranks get to write their stacks.")
    parser.add_argument("--start-deadline", type=float, default=None,
                        help="Hang when no beat of this attempt comes this many seconds after start (start_deadline_s).")
    args = parser.parse_args(argv)
    # The job script ends us when the trainer exits. At once and quietly: a SystemExit raised by the handler
    # can land in the interpreter's own shutdown, which prints it to the job log as a traceback.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    return watch(args.run_dir, args.trainer_pid, args.k, args.floor, args.poll, args.dump_wait, args.start_deadline)


if __name__ == "__main__":
    sys.exit(main())
