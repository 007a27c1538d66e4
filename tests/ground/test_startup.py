"""ground.startup: the collector is off from starting() to settled(), and settled() alone changes nothing."""

from __future__ import annotations

import subprocess
import sys

from ground.paths import REPO_ROOT

PROBE = """
import gc
from ground import startup
frozen = gc.get_freeze_count()
startup.settled()  # no starting() in this process: a library call leaves the collector as it was
untouched = (gc.isenabled(), gc.get_freeze_count() == frozen)
startup.starting()
off = not gc.isenabled()
import json, fractions, decimal  # objects the start-up keeps
startup.settled()
print(untouched, off, gc.isenabled(), gc.get_freeze_count() > frozen)
startup.settled()  # twice is once
print(gc.isenabled())
"""


def test_the_collector_is_off_between_starting_and_settled_and_settled_alone_does_nothing() -> None:
    # A process of its own: freezing the test worker's objects would keep its garbage for good.
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          check=True)
    assert done.stdout.split("\n")[:2] == ["(True, True) True True True", "True"]
