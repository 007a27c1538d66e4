"""A tiny job entry for executor tests (``--entry tests.jobs_entry``), used where the real trainer is
not the thing under test. It honours the trainer's contract: read ``RUN_DIR/spec.json``, checkpoint
on SIGUSR1/SIGTERM and exit 75, resume from the checkpoint. ``IDMCTL_TEST_BEHAVIOR`` picks what it does:

- ``steps:N[:SECONDS]``: N steps of SECONDS each (default 0.2), checkpoint after every step, each
  reported as the entry contract's ``IDMCTL_STEP`` line (``IDMCTL_SMOKE_STEPS`` overrides N: the smoke)
- ``typeerror``: raise TypeError at start (card A 6321)
- ``oom``: allocate memory until the cgroup kills it
- ``ranks``: every rank writes ``rank-<SLURM_PROCID>.txt`` and exits 0
- ``affinity``: every rank writes ``affinity-<SLURM_PROCID>.json`` (its CPU count by ``sched_getaffinity``,
  its node, ``SLURM_CPUS_PER_TASK``, ``SRUN_CPUS_PER_TASK``) and exits 0
- ``emit:FILE``: print FILE's ``log`` text and exit with its ``exit`` status (a failure sample, JSON)
- ``hang:N:TOTAL[:SECONDS]``: like ``steps:TOTAL:SECONDS`` with the trainer's heartbeat (progress.json),
  but the chain's first attempt deadlocks after step N (a lock taken twice in the main thread, while a
  second thread waits on it: two stacks for the watchdog's dump); later attempts resume and finish
- ``stuck:TOTAL[:SECONDS]``: every attempt resumes, beats once and deadlocks before its first step, so no
  attempt commits a newer checkpoint (a crash loop: the watchdog kills each one as ``hang``)

Every checkpoint is also a ``checkpoint`` event of ``events.jsonl`` (ground.run_events), as the trainer writes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from ground.run_events import CHECKPOINT, append_event
from ground.contract import ENV_ATTEMPT, ENV_SMOKE_STEPS, EXIT_REQUEUE, SPEC_FILE, STACKS_SIGNAL, STEP_MARKER


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True, type=Path)
    run_dir = parser.parse_args().run_dir
    spec = json.loads((run_dir / SPEC_FILE).read_text())
    behavior = os.environ.get("IDMCTL_TEST_BEHAVIOR", "steps:3")
    import faulthandler

    faulthandler.register(getattr(signal, f"SIG{STACKS_SIGNAL}"), all_threads=True)  # as trainers.train does
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    print(f"entry: {spec['name']} {spec['hash'][:12]} rank {rank} behavior {behavior}", flush=True)
    if behavior == "typeerror":
        raise TypeError("HiddenMultiLayer.__init__() got an unexpected keyword argument 'selected_layer_indices'")
    if behavior == "oom":
        hoard = []
        while True:
            hoard.append(bytearray(32 * 2**20))
            time.sleep(0.01)
    if behavior.startswith("emit:"):
        sample = json.loads(Path(behavior.removeprefix("emit:")).read_text())
        print(sample["log"], flush=True)
        return int(sample["exit"])
    if behavior == "ranks":
        (run_dir / f"rank-{rank}.txt").write_text(os.environ.get("SLURM_NODEID", "?"))
        return 0
    if behavior == "affinity":  # the CPUs this rank may run on, and what srun and sbatch told it
        (run_dir / f"affinity-{rank}.json").write_text(json.dumps({
            "cpus": len(os.sched_getaffinity(0)), "node": os.environ.get("SLURMD_NODENAME"),
            **{key: os.environ.get(key) for key in ("SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "SLURM_NTASKS")}}))
        return 0
    if behavior.startswith("hang:"):
        _, hang_at, total, *rest = behavior.split(":")
        first = os.environ.get(ENV_ATTEMPT, "1") == "1"
        return _steps(run_dir, int(total), float(rest[0]) if rest else 0.2, hang_at=int(hang_at) if first else None)
    if behavior.startswith("stuck:"):
        _, total, *rest = behavior.split(":")
        return _steps(run_dir, int(total), float(rest[0]) if rest else 0.2, stuck=True)
    _, total, *rest = behavior.split(":")
    smoke = os.environ.get(ENV_SMOKE_STEPS)  # the preflight's smoke of this entry (the entry contract)
    return _steps(run_dir, int(smoke or total), float(rest[0]) if rest else 0.2)


def _heartbeat(run_dir: Path, step: int, total: int, seconds: float, started: float) -> None:
    """The trainer's progress.json (ground.progress), rewritten every step as the heartbeat."""
    from ground.progress import Progress, write_progress

    spec = json.loads((run_dir / SPEC_FILE).read_text())
    write_progress(run_dir, Progress(step=step, total=total, window_s_per_step=seconds, window_steps=step,
                                     attempt_start_step=0, attempt_started_at=started, updated_at=time.time(),
                                     spec_hash=spec["hash"], code_version="test", timing_key="test"))


def _deadlock(step: int) -> None:
    import threading

    lock = threading.Lock()
    lock.acquire()
    waiter = threading.Thread(target=lock.acquire, name="loader-waiter", daemon=True)
    waiter.start()
    print(f"entry: deadlocking after step {step}", flush=True)
    lock.acquire()  # never returns: the main thread waits on a lock it holds


def _steps(run_dir: Path, total: int, seconds: float, hang_at: int | None = None, stuck: bool = False) -> int:
    ckpt = run_dir / "ckpt.json"
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    print(f"entry: resumed from step {step}" if step else "entry: starting at step 0", flush=True)
    notice = {"got": False}
    started = time.time()
    signal.signal(signal.SIGUSR1, lambda *_: notice.update(got=True))
    signal.signal(signal.SIGTERM, lambda *_: notice.update(got=True))
    if stuck:
        _heartbeat(run_dir, step, total, seconds, started)
        _deadlock(step)
    while step < total:
        if notice["got"]:
            print(f"entry: checkpointed at step {step} on signal, exiting {EXIT_REQUEUE}", flush=True)
            return EXIT_REQUEUE
        time.sleep(seconds)
        step += 1
        # One temp file per process: with 2 tasks per node both ranks checkpoint, and a shared temp name let
        # one rank rename the other's file away (FileNotFoundError, the blocker of 5961 died, 5961 ran).
        tmp = ckpt.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, ckpt)
        if rank == 0:
            append_event(run_dir, CHECKPOINT, step=step)
        print(f"entry: step {step}", flush=True)
        print(f"{STEP_MARKER} step={step} loss={1.0 / step:.4f} seconds={seconds:.3f}", flush=True)
        if hang_at is not None:
            _heartbeat(run_dir, step, total, seconds, started)
            if step == hang_at:
                _deadlock(step)
    (run_dir / "steps_done.txt").write_text(str(step))
    print(f"entry: done {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
