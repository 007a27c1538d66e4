"""scripts/cpu_hog.sh: busy loops around a command (its exit code passes through, the loops end with
it) or in the background between `start` and `stop`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ground.processes import alive
from slurm_support import wait_until

REPO = Path(__file__).resolve().parent.parent
HOG = str(REPO / "scripts" / "cpu_hog.sh")


def test_wrapping_a_command_passes_its_exit_code_and_stops_the_loops(tmp_path: Path) -> None:
    # The wrapped command lists its siblings: the busy loops, children of the script like itself.
    probe = "ps -o pid= --ppid $PPID | grep -vw $$ | grep -vw $BASHPID > loops; exit 7"
    done = subprocess.run([HOG, "-n", "2", "--", "bash", "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 7
    assert "cpu_hog: 2 busy loop(s)" in done.stderr
    loops = [int(p) for p in (tmp_path / "loops").read_text().split()]
    assert len(loops) == 2
    assert not any(alive(pid) for pid in loops)


def test_start_and_stop_keep_the_loops_in_between(tmp_path: Path) -> None:
    env = {**os.environ, "CPU_HOG_PIDFILE": str(tmp_path / "hog.pids")}
    started = subprocess.run([HOG, "start", "-n", "1"], env=env, capture_output=True, text=True, timeout=30)
    try:
        assert started.returncode == 0, started.stderr
        pids = [int(p) for p in (tmp_path / "hog.pids").read_text().split()]
        assert len(pids) == 1 and alive(pids[0])
        again = subprocess.run([HOG, "start"], env=env, capture_output=True, text=True, timeout=30)
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = subprocess.run([HOG, "stop"], env=env, capture_output=True, text=True, timeout=30)
    assert stopped.returncode == 0 and "stopped 1 busy loop(s)" in stopped.stdout
    assert not (tmp_path / "hog.pids").exists()
    wait_until(lambda: not alive(pids[0]), 10, f"busy loop {pids[0]} to end after `stop`", poll_s=0.05)
