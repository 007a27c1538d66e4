"""The cluster's state lock (slurm_support): readers share it, a change of the cluster waits for the
readers running now and keeps new ones out until it is done. Exercised on a lock file of its own, so
no cluster is needed and no session's cluster tests are held up."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

import pytest

import slurm_support
from slurm_support import cluster_changing, cluster_reading

# Long enough that a lock taken wrongly would show; short enough for a fast test.
STILL_OUT_S = 0.3


@pytest.fixture
def lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    lock = tmp_path / "run" / "test-outage.lock"
    lock.parent.mkdir()
    monkeypatch.setattr(slurm_support, "OUTAGE_LOCK", lock)
    return lock


def _in_thread(context, entered: threading.Event, leave: threading.Event) -> threading.Thread:
    def body() -> None:
        with context():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_two_readers_hold_the_lock_at_once(lock_file: Path) -> None:
    entered, leave = threading.Event(), threading.Event()
    with cluster_reading():
        other = _in_thread(cluster_reading, entered, leave)
        assert entered.wait(5), "a second reader waited for the first"
    leave.set()
    other.join(5)


def test_a_change_waits_for_the_reader_and_keeps_the_next_reader_out(lock_file: Path) -> None:
    change_in, change_leave = threading.Event(), threading.Event()
    with cluster_reading():
        changer = _in_thread(cluster_changing, change_in, change_leave)
        assert not change_in.wait(STILL_OUT_S), "the change started while a reader was reading"
    assert change_in.wait(5), "the change did not start once the reader was done"
    reader_in, reader_leave = threading.Event(), threading.Event()
    reader = _in_thread(cluster_reading, reader_in, reader_leave)
    assert not reader_in.wait(STILL_OUT_S), "a reader started during the change"
    change_leave.set()
    assert reader_in.wait(5), "the reader did not start once the change was done"
    reader_leave.set()
    for thread in (changer, reader):
        thread.join(5)


def test_two_changes_never_overlap(lock_file: Path) -> None:
    inside: list[int] = []
    most = [0]

    def change() -> None:
        with cluster_changing():
            inside.append(1)
            most[0] = max(most[0], len(inside))
            time.sleep(0.05)
            inside.pop()

    threads = [threading.Thread(target=change) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most[0] == 1


def test_without_a_cluster_a_reader_needs_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-cluster" / "run" / "test-outage.lock"
    monkeypatch.setattr(slurm_support, "OUTAGE_LOCK", missing)
    with cluster_reading():
        pass
    assert not missing.parent.exists()


@pytest.mark.slurm
@pytest.mark.cluster_reader
def test_a_test_marked_cluster_reader_holds_the_lock_shared_and_stays_out_of_the_group(
        request: pytest.FixtureRequest) -> None:
    """conftest's marking: a slurm test marked cluster_reader is not in the job tests' xdist group, and
    while it runs no change can take the cluster's real state lock."""
    if not slurm_support.OUTAGE_LOCK.parent.is_dir():
        pytest.skip("no local Slurm cluster (run scripts/slurm/up.sh)")
    assert request.node.get_closest_marker("xdist_group") is None
    with open(slurm_support.OUTAGE_LOCK, "a") as lock:
        with pytest.raises(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)  # another reader still gets in
        fcntl.flock(lock, fcntl.LOCK_UN)
