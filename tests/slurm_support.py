"""Helpers for tests on the local Slurm cluster (scripts/slurm/up.sh).

Outside CI a missing cluster skips the test; in CI (``$CI`` set) it fails: the cluster must be up.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ground.processes import alive
from net_support import free_port


def _clusters() -> list[str]:
    """The local clusters scripts/test.sh brought up, one per worker (``IDMCTL_SLURM_ROOTS``, space-separated
    roots); empty when it named none (a cluster brought up by hand, or none)."""
    return os.environ.get("IDMCTL_SLURM_ROOTS", "").split()


def _use_this_workers_cluster() -> None:
    """Point this pytest process, and every command it starts, at its own cluster: worker gwK takes the
    K-th of ``IDMCTL_SLURM_ROOTS`` (modulo their number), a process that is no worker the first. Set in
    the environment before anything reads it: the fixtures, the benchmark modules and the CLI all find
    the cluster through ``SLURM_CONF`` and ``IDMCTL_SLURM_ROOT``."""
    roots = _clusters()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not roots or not worker.startswith("gw"):
        return
    root = roots[int(worker[2:]) % len(roots)]
    os.environ["IDMCTL_SLURM_ROOT"] = root
    conf = _conf_in(Path(root) / "env")
    if conf:
        os.environ["SLURM_CONF"] = conf


def _conf_in(env_file: Path) -> str | None:
    """The ``SLURM_CONF`` a cluster's env file (scripts/slurm/up.sh writes it) exports, if it exists."""
    if not env_file.exists():
        return None
    for line in env_file.read_text().splitlines():
        if line.startswith("export SLURM_CONF="):
            return line.split("=", 1)[1]
    return None


_use_this_workers_cluster()


def cluster_per_worker() -> bool:
    """Whether every worker has a cluster of its own: then its Slurm tests need no group, since a worker
    runs one test at a time. Decided alike in every worker (each collects the tests itself)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return workers > 1 and len(_clusters()) >= workers


ENV_FILE = Path(os.environ.get("IDMCTL_SLURM_ROOT", "/tmp/idmctl-slurm")) / "env"
# With one cluster for all workers, the pytest-xdist group of every test that uses it (tests/conftest.py
# puts each ``slurm``-marked test in it): one worker runs them one after another, so a test that stops
# slurmdbd, changes a QoS or fills both nodes never overlaps another one's jobs. A test that reaches the
# cluster without needing it (the benchmarks measure sbatch when it is there) joins it by name
# (``cluster_group_marks``). With a cluster per worker no test needs the group.
SLURM_GROUP = "local_slurm"


def cluster_group_marks() -> list[pytest.MarkDecorator]:
    """The marks that keep a test off every other job test's cluster time: the group, unless each worker
    has a cluster of its own."""
    return [] if cluster_per_worker() else [pytest.mark.xdist_group(SLURM_GROUP)]


def slurm_conf() -> str:
    conf = os.environ.get("SLURM_CONF") or _conf_in(ENV_FILE)
    if not conf or not Path(conf).exists():
        if os.environ.get("CI"):
            pytest.fail("CI needs the local Slurm cluster: SLURM_CONF is not set (scripts/test.sh brings it up)")
        pytest.skip("no local Slurm cluster (run scripts/slurm/up.sh)")
    return conf


def sh(*args: str, check: bool = True) -> str:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} → {result.returncode}: {result.stderr}")
    return result.stdout


def wait_until(predicate, timeout_s: float, what, poll_s: float = 0.5):
    """Poll ``predicate`` until it returns something truthy; ``what`` names the wait, and may be a
    callable so that the timeout line can say what was seen at the deadline (a log tail, a state)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(poll_s)


def text_so_far(path: Path) -> str:
    """A job log as far as it is written: Slurm creates ``--output`` only when the job starts, so a wait
    on a log must read a file that does not exist yet as empty, not crash on it."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def sacct_state(job_id: str) -> str:
    lines = sh("sacct", "-n", "-P", "-X", "-j", job_id, "--format=State", check=False).split()
    return lines[-1] if lines else ""


def squeue_state(job_id: str) -> str:
    return sh("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False).strip()


def release_requeued(job_id: str) -> None:
    """Let a requeued job start in 2 s instead of after the ``cred_expire + 1`` s hold Slurm puts it under.

    Not at once: slurmd revokes the old run's credential with one-second resolution, so a run started in
    the second of the requeue is refused ("Killing non-startable batch JobId=…: Job credential revoked")
    and the job ends FAILED (seen under a CPU hog, where the requeue and the release fell in one second).
    Only a begin time more than 3 s away is moved, so calling this on every poll never delays the start.
    """
    line = sh("squeue", "-h", "-j", job_id, "-o", "%T|%r|%S", check=False).strip()
    state, _, rest = line.partition("|")
    reason, _, begin = rest.partition("|")
    if state != "PENDING" or reason != "BeginTime":
        return
    try:
        held_s = time.mktime(time.strptime(begin, "%Y-%m-%dT%H:%M:%S")) - time.time()
    except ValueError:
        return
    if held_s > 3:
        sh("scontrol", "update", f"JobId={job_id}", "StartTime=now+2", check=False)


SLURM_ROOT = Path(os.environ.get("IDMCTL_SLURM_ROOT", "/tmp/idmctl-slurm"))
# The cluster's state lock, one file for every session on this cluster. A test that changes what other
# tests read (stops slurmdbd, edits a QoS, takes a node down) holds it exclusively while it changes it
# (cluster_changing); a test that only reads the cluster (queries, `sbatch --test-only`, a copy of
# slurm.conf with dead ports) is marked ``cluster_reader`` and holds it shared for its whole run
# (cluster_reading, from conftest's fixture of that name). Readers leave the xdist group of the job tests and run beside them: they take no
# node, and a job test neither changes the cluster nor needs it idle for a reader's sake.
OUTAGE_LOCK = SLURM_ROOT / "run" / "test-outage.lock"
SLURMDBD_BACK_S = 60


def _alive(pid: int, comm: str) -> bool:
    """A daemon is alive when /proc/PID is that program and not a zombie: PID 1 reaps a stopped daemon late."""
    try:
        return alive(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == comm
    except OSError:
        return False


def sacct_answers() -> bool:
    return subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, timeout=30).returncode == 0


@contextmanager
def _state_lock(mode: int) -> Iterator[None]:
    OUTAGE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(OUTAGE_LOCK, "a") as lock:
        fcntl.flock(lock, mode)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def cluster_changing() -> Iterator[None]:
    """The block changes the shared cluster for everyone (a daemon stopped, a QoS edited, a node down):
    it waits for the readers running now and keeps new ones (and other changes) out until it is done."""
    with _state_lock(fcntl.LOCK_EX):
        yield


@contextmanager
def cluster_reading() -> Iterator[None]:
    """The block reads the shared cluster as scripts/slurm/up.sh set it up: never during a change.
    Without a cluster (no run folder) there is nothing to keep out."""
    if not OUTAGE_LOCK.parent.is_dir():
        yield
        return
    with _state_lock(fcntl.LOCK_SH):
        yield


@contextmanager
def slurmdbd_stopped() -> Iterator[None]:
    """Stop the shared cluster's slurmdbd for the body of the ``with``, then start it the way
    scripts/slurm/up.sh does and wait until sacct answers again, whatever happened in the body.

    Other engineers share the cluster: keep the body to a few seconds. The cluster's state lock keeps
    two outage tests (from any session) from overlapping, so one never restarts what another expects
    stopped, and keeps the readers out while sacct cannot answer.
    """
    slurm_conf()
    with cluster_changing():
        pid_file = SLURM_ROOT / "run" / "slurmdbd.pid"
        pid = int(pid_file.read_text().strip())
        assert _alive(pid, "slurmdbd"), f"slurmdbd (pid {pid}) is not running before the outage"
        try:
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not _alive(pid, "slurmdbd"), 30, f"slurmdbd pid {pid} to stop")
            yield
        finally:
            # slurmdbd removes its pid file when it exits; a fresh one (or none) is read tolerantly.
            current = pid_file.read_text().strip() if pid_file.exists() else ""
            if not (current.isdigit() and _alive(int(current), "slurmdbd")):
                subprocess.run(["/usr/sbin/slurmdbd"], check=True, timeout=60)
            wait_until(sacct_answers, SLURMDBD_BACK_S, "sacct to answer again after restarting slurmdbd")


def conf_with_unreachable(tmp: Path, *, controller: bool = False, accounting: bool = False) -> Path:
    """A copy of the cluster's slurm.conf whose slurmctld and/or slurmdbd port has nothing listening:
    the real Slurm clients then fail exactly as against a stopped daemon (connection refused), without
    stopping a controller that other engineers' jobs and submissions are using at that moment."""
    real = Path(slurm_conf())
    tmp.mkdir(parents=True, exist_ok=True)
    dead_port = free_port()
    lines = []
    for line in real.read_text().splitlines():
        if controller and line.startswith("SlurmctldPort="):
            line = f"SlurmctldPort={dead_port}"
        if accounting and line.startswith("AccountingStoragePort="):
            line = f"AccountingStoragePort={dead_port}"
        lines.append(line)
    conf = tmp / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    for extra in real.parent.iterdir():  # cgroup.conf, gres.conf beside it
        if extra.name not in ("slurm.conf", "slurmdbd.conf") and extra.is_file():
            (tmp / extra.name).write_text(extra.read_text())
    return conf
