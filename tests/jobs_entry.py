"""A tiny job entry for executor tests (``--entry tests.jobs_entry``), used where the real trainer is
not the thing under test. It honours the trainer's contract: read ``RUN_DIR/spec.json``, checkpoint
on SIGUSR1/SIGTERM and exit 75, resume from the checkpoint. ``IDMCTL_TEST_BEHAVIOR`` picks what it does:

- ``steps:N[:SECONDS]``: N steps of SECONDS each (default 0.2), checkpoint after every step
- ``typeerror``: raise TypeError at start (card A 6321)
- ``oom``: allocate memory until the cgroup kills it
- ``ranks``: every rank writes ``rank-<SLURM_PROCID>.txt`` and exits 0
- ``emit:FILE``: print FILE's ``log`` text and exit with its ``exit`` status (a failure sample, JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from ground.contract import EXIT_REQUEUE, SPEC_FILE


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True, type=Path)
    run_dir = parser.parse_args().run_dir
    spec = json.loads((run_dir / SPEC_FILE).read_text())
    behavior = os.environ.get("IDMCTL_TEST_BEHAVIOR", "steps:3")
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
    _, total, *rest = behavior.split(":")
    return _steps(run_dir, int(total), float(rest[0]) if rest else 0.2)


def _steps(run_dir: Path, total: int, seconds: float) -> int:
    ckpt = run_dir / "ckpt.json"
    step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    print(f"entry: resumed from step {step}" if step else "entry: starting at step 0", flush=True)
    notice = {"got": False}
    signal.signal(signal.SIGUSR1, lambda *_: notice.update(got=True))
    signal.signal(signal.SIGTERM, lambda *_: notice.update(got=True))
    while step < total:
        if notice["got"]:
            print(f"entry: checkpointed at step {step} on signal, exiting {EXIT_REQUEUE}", flush=True)
            return EXIT_REQUEUE
        time.sleep(seconds)
        step += 1
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, ckpt)
        print(f"entry: step {step}", flush=True)
    (run_dir / "steps_done.txt").write_text(str(step))
    print(f"entry: done {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
