"""The smoke's host-memory peak is the child's own, not inherited from a large parent process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD = "from trainers.train import host_peak_rss_bytes; print(host_peak_rss_bytes())"


def test_child_peak_ignores_the_parents_memory():
    hoard = bytearray(800 * 2**20)  # touch it: the parent's RSS is now ≥ 800 MB
    for offset in range(0, len(hoard), 4096):
        hoard[offset] = 1
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, cwd=REPO)
    child_peak = int(out.stdout.strip())
    assert 10 * 2**20 < child_peak < 600 * 2**20, child_peak  # torch import alone is ~250 MB
    del hoard
