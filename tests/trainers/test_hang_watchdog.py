"""The hang watchdog (trainers/watchdog.py): a real job on the local Slurm cluster deadlocks after 3 steps;
the watchdog dumps every rank's Python stacks into the log, kills it, sync classifies ``hang``, excludes
the node and resumes the chain from its checkpoint, which completes. The latency from the last
heartbeat to the classification in the store is measured against max(k × step, floor) + one sync interval."""

from __future__ import annotations

import json
import re
import signal
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlmodel import select

from ground import contract
from ground.heartbeat import Heartbeat, threshold_s
from idmctl.core.profile import load_profile
from idmctl.record.db import session
from idmctl.record.models import Failure, Job, NodeExclusion
from slurm_support import text_so_far, wait_until

REPO = Path(__file__).resolve().parents[2]
STEP_S = 0.3
SYNC_INTERVAL_S = 2.0
"""How often the test runs `idmctl sync` (as `idmctl watch --interval 2` would)."""


def test_threshold_is_k_steps_or_the_floor() -> None:
    assert threshold_s(Heartbeat(step=5, at=0.0, s_per_step=30.0), k=10, floor=600) == 600  # card: 300 s < floor
    assert threshold_s(Heartbeat(step=5, at=0.0, s_per_step=100.0), k=10, floor=600) == 1000  # N=12 dense steps
    assert threshold_s(Heartbeat(step=0, at=0.0, s_per_step=None), k=10, floor=600) == 600


def test_the_watchdog_dumps_and_kills_a_local_deadlock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The local executor's path (no Slurm): the trainer's process tree gets SIGUSR2, then SIGKILL."""
    import os
    import subprocess
    import sys

    from ground.run_dir import write_run_spec
    from ground.spec.loader import load_spec
    from trainers.watchdog import watch

    write_run_spec(tmp_path, load_spec("quickstart"))
    env = {**os.environ, "IDMCTL_TEST_BEHAVIOR": "hang:2:5:0.1", contract.ENV_ATTEMPT: "1", "PYTHONPATH": str(REPO)}
    env.pop("SLURM_JOB_ID", None)
    with open(tmp_path / "entry.log", "w") as log:
        entry = subprocess.Popen([sys.executable, "-m", "tests.jobs_entry", "--run-dir", str(tmp_path)], cwd=REPO,
                                 env=env, stdout=log, stderr=subprocess.STDOUT)
        # watch() is a process's main: once it fires it ignores SIGTERM for good. Here it runs inside
        # pytest, whose later subprocesses would inherit the ignored TERM (a CPU hog that cannot be
        # stopped, a trainer that cannot be cancelled): restore the handler.
        previous = signal.getsignal(signal.SIGTERM)
        try:
            assert watch(tmp_path, entry.pid, k=5, floor=2.0, poll=0.2, dump_wait=0.5) == contract.EXIT_HANG
            assert entry.wait(timeout=30) == -9  # SIGKILL
        finally:
            signal.signal(signal.SIGTERM, previous)
            entry.kill()
    text = (tmp_path / "entry.log").read_text()
    assert "entry: deadlocking after step 2" in text and "in _deadlock" in text, text
    assert f"{contract.FAILURE_MARKER} cause=hang " in capsys.readouterr().err


def test_a_start_up_that_never_beats_is_a_hang_at_its_deadline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trainer stuck before its first step (here: a process that only sleeps, with faulthandler on the stacks
    signal as the trainer has) never arms the heartbeat check; the start-up deadline catches it."""
    import subprocess
    import sys

    from idmctl.ops.failures.classify import classify
    from trainers.watchdog import start_deadline_s, watch

    # 200 GB to stage at 1 GB/s and a 30 s build, margin 2: 460 s; nothing measured: the floor.
    assert start_deadline_s(200_000_000_000, 1e9, 30.0, margin=2.0, floor=300.0) == 460.0
    assert start_deadline_s(0, None, None, margin=2.0, floor=300.0) == 300.0
    stuck = subprocess.Popen([sys.executable, "-c", "import faulthandler, signal, time; "
                              f"faulthandler.register(signal.SIG{contract.STACKS_SIGNAL}); time.sleep(120)"],
                             stderr=subprocess.PIPE, text=True)
    previous = signal.getsignal(signal.SIGTERM)  # watch() ignores TERM once it fires (see the test above)
    try:
        started = time.monotonic()
        assert watch(tmp_path, stuck.pid, k=5, floor=600.0, poll=0.2, dump_wait=0.5, start_deadline=1.0) == \
            contract.EXIT_HANG
        assert time.monotonic() - started < 30  # the deadline, not the 600 s floor of a running trainer
        assert stuck.wait(timeout=30) == -9
    finally:
        signal.signal(signal.SIGTERM, previous)
        stuck.kill()
    assert "in <module>" in (stuck.stderr.read() if stuck.stderr else "")  # its stacks were dumped first
    marker = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(rf"{contract.FAILURE_MARKER} cause=hang node=\S+ phase=start step=none silent_s=\d+\.\d "
                        r"threshold_s=1\.0", marker), marker
    assert classify("FAILED", exit_code=f"{contract.EXIT_HANG}:0", log_tail=marker, started=True).cause == "hang"


def test_a_term_during_the_watchdogs_own_shutdown_leaves_the_job_log_clean(tmp_path: Path) -> None:
    """The job script TERMs the watchdog when the trainer exits; a trainer that fails in its first second
    exits before the watchdog has finished. The TERM lands in the watchdog's interpreter shutdown here on
    purpose (an atexit callback sends it): no traceback may reach the log, where it would read as the
    job's failure."""
    import os
    import subprocess
    import sys

    gone = subprocess.Popen(["true"])
    gone.wait()  # a trainer pid that has exited: watch() returns at once and the interpreter shuts down
    code = ("import atexit, os, signal, sys, time\n"
            "from trainers.watchdog import main\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(5)))\n"
            "sys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", code, "--run-dir", str(tmp_path), "--trainer-pid", str(gone.pid),
                           "--k", "10", "--floor", "600", "--poll", "0.01"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout.startswith("idmctl: watchdog on "), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.slurm
def test_a_deadlocked_job_is_dumped_killed_classified_and_resumed(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_slurm: str) -> None:
    from test_failure_replay import replay_spec, submit

    import yaml

    # local-slurm with a 10 s floor and a 1 s poll (the shipped one waits 2 min: tiny jobs on shared cores
    # stall that long in start-up); a profile given by path is used as the named ones are.
    profile = yaml.safe_load((REPO / "clusters" / "local-slurm.yaml").read_text())
    profile["hang"] = {"k": 5, "floor": "10s", "poll": "1s"}
    (tmp_path / "fast-hang.yaml").write_text(yaml.safe_dump(profile))
    monkeypatch.setenv(contract.ENV_CLUSTER, str(tmp_path / "fast-hang.yaml"))
    hang = load_profile(str(tmp_path / "fast-hang.yaml"))[0].hang
    threshold = max(hang.k * STEP_S, hang.floor_seconds)
    spec = replay_spec(tmp_path, "wrong_class_kwarg")
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"hang:3:8:{STEP_S}")
    first = submit(cli, spec, "--entry", "tests.jobs_entry", "--retries", "1", "-J", "hang_replay")
    script = Path(first["script"]).read_text()
    assert (f"-m trainers.watchdog --run-dir \"$RUN_DIR\" --trainer-pid \"$TRAINER\" --k {hang.k:g} "
            f"--floor {hang.floor_seconds:g} --poll {hang.poll_seconds:g} --start-deadline "
            f"{hang.start_floor_seconds:g} &") in script

    sync_starts: list[float] = []
    sync_ends: list[float] = []
    first_seen: dict[str, str] = {}

    def hang_recorded() -> float | None:
        sync_starts.append(time.time())
        assert cli("sync").exit_code == 0
        sync_ends.append(time.time())
        with session() as db:
            job = db.exec(select(Job).where(Job.scheduler_id == first["scheduler_id"])).one()
            found = db.exec(select(Failure).where(Failure.job_id == job.id)).first()
        if found is None:
            return None
        first_seen.update(json.loads(found.detail_json), cause=found.cause, evidence=found.evidence)
        written = found.classified_at  # when this sync wrote the row (UTC, stored without the offset)
        return (written if written.tzinfo else written.replace(tzinfo=timezone.utc)).timestamp()

    classified_at = wait_until(hang_recorded, 120, "the hung job to be classified", poll_s=SYNC_INTERVAL_S)
    # The first sync after the threshold classifies it: from the silent heartbeat while the job still runs
    # (sync's own look, seen_by=sync), or from the watchdog's marker once the job has ended.
    assert (first_seen["cause"], first_seen["step"]) == ("hang", "3"), first_seen
    path = "sync's look at the heartbeat" if first_seen.get("seen_by") == "sync" else "the watchdog's marker"
    interval = max(b - a for a, b in zip(sync_starts, sync_starts[1:]))

    def chain_completed() -> bool:
        assert cli("sync").exit_code == 0
        with session() as db:
            jobs = list(db.exec(select(Job).where(Job.chain_id == first["chain"]).order_by(Job.attempt)))
        return len(jobs) == 2 and jobs[1].state == "COMPLETED"

    wait_until(chain_completed, 120, "the resumed attempt to complete", poll_s=SYNC_INTERVAL_S)
    with session() as db:
        failed, resumed = db.exec(select(Job).where(Job.chain_id == first["chain"]).order_by(Job.attempt)).all()
        exclusions = [(e.node, e.reason) for e in db.exec(select(NodeExclusion))]

    assert (failed.state, failed.exit_code) == ("FAILED", f"{contract.EXIT_HANG}:0")
    row = next(r for r in json.loads(cli("failures", "--json").output) if r["job"] == first["scheduler_id"])
    assert row["cause"] == "hang"
    assert (row["detail"]["node"], row["detail"]["step"]) == (failed.node_list, "3")
    assert exclusions == [(failed.node_list, f"hang under job {first['scheduler_id']}")]
    assert resumed.node_list != failed.node_list
    # The stacks are in the failed attempt's log: both threads of the rank, down to the deadlock's frame.
    log = text_so_far(Path(failed.log_path or ""))
    assert "idmctl: watchdog: no heartbeat for " in log
    assert re.search(r"Current thread 0x[0-9a-f]+ \(most recent call first\):", log), log[-3000:]
    assert len(re.findall(r"^Thread 0x[0-9a-f]+ \(most recent call first\):", log, re.M)) >= 1, log[-3000:]
    # The job runs its code snapshot, so the stacks name the snapshot's copy of the entry.
    assert re.search(r'File "\S+/code/snapshots/[0-9a-f]{16}/tests/jobs_entry\.py", line', log) and "in _deadlock" in log
    assert log.index("in _deadlock") < log.index(f"{contract.FAILURE_MARKER} cause=hang")  # dumped, then killed
    resumed_log = text_so_far(Path(resumed.log_path or ""))
    assert "entry: resumed from step 3" in resumed_log and "entry: done 8 steps" in resumed_log

    last_beat = datetime.fromisoformat(row["detail"]["last_beat"]).timestamp()
    assert row["detail"]["last_beat"] == first_seen["last_beat"]  # the watchdog and sync saw the same beat
    # The guarantee, stated without a stopwatch: the hang is classified by the first sync that looks after the
    # threshold has passed (sync's own look while the job runs or lags in sacct, the marker once it ended):
    # the first sync that ends after it (it may look just past the threshold: a sync that started 0.3 s before
    # it on a loaded machine did, in a full run) or, at the latest, the one after that.
    # Hence latency ≤ threshold + one sync interval (+ the part of that sync before it writes the row).
    ended_after = [i for i, end in enumerate(sync_ends) if end > last_beat + threshold]
    assert ended_after and ended_after[0] <= len(sync_starts) - 1 <= ended_after[0] + 1, (
        sync_starts, sync_ends, last_beat + threshold)
    latency = classified_at - last_beat
    bound = threshold + interval
    print(f"hang classified {latency:.1f} s after the last heartbeat; threshold max({hang.k:g} × {STEP_S} s, "
          f"{hang.floor_seconds:g} s) = {threshold:.1f} s, + one sync interval (longest between two syncs here) "
          f"{interval:.1f} s = {bound:.1f} s; classified by {path}; the job's watchdog fired after "
          f"{float(row['detail']['silent_s']):.1f} s of silence")
    assert threshold <= float(row["detail"]["silent_s"])  # never before the threshold
    assert classified_at <= sync_ends[-1]  # written by the sync that first looked after the threshold


def test_sync_classifies_a_running_job_whose_heartbeat_is_silent(tmp_path: Path) -> None:
    """Sync's own look (for jobs it sees): a running job silent past max(k × s/step, floor) gets its `hang`
    row at once, once per run; a fresh beat, or a beat older than this run's start, is no hang."""
    import os

    from ground.paths import atomic_write_text
    from idmctl.core.job_state import JobState
    from idmctl.ops.sync import _note_hang
    from idmctl.record.memory_store import MemoryStore
    from idmctl.record.store import NewJob, Observation

    now = time.time()
    run_dir = tmp_path / "run"

    def beat_at(moment: float) -> None:
        atomic_write_text(run_dir / contract.PROGRESS_FILE, json.dumps({"step": 7, "window_s_per_step": 0.5,
                                                                        "updated_at": moment}))
        os.utime(run_dir / contract.PROGRESS_FILE, (moment, moment))

    started = datetime.fromtimestamp(now - 60, timezone.utc).isoformat()
    options = {"hang_k": 5, "hang_floor_s": 10}
    records = MemoryStore()  # sync's look at the heartbeat, not the storage, is under test
    chain = records.open_chain("x", "h", 0)
    job = records.submitting(NewJob(chain_id=chain.id, attempt=1, experiment="x", executor="slurm",
                                    script_path=str(run_dir / "attempt-1.sbatch"), options=options))
    records.submitted(job.id, "77", None, datetime.fromtimestamp(now - 70, timezone.utc))
    job = records.observed(job.id, Observation(state=JobState.RUNNING, state_text="RUNNING", node_list="n2",
                                               runs=({"state": "RUNNING", "started_at": started},),
                                               started_at=datetime.fromtimestamp(now - 60, timezone.utc)))
    beat_at(now - 5)  # 5 s < max(5 × 0.5 s, 10 s)
    assert not _note_hang(records, job)
    beat_at(now - 90)  # before this run started: a previous run's file
    assert not _note_hang(records, job)
    beat_at(now - 30)
    assert _note_hang(records, job)
    looked = time.time()
    assert not _note_hang(records, job)  # one failure per run
    (failure,) = records.failures([job.id])
    detail = failure.detail
    assert (failure.cause, detail["seen_by"], detail["step"], detail["run"], detail["node"]) == ("hang", "sync", "7", 1, "n2")
    line = failure.evidence.splitlines()[1]
    silent = re.match(r"sync: no heartbeat for (\d+\.\d) s since step 7 at ", line)
    assert silent, line
    # The beat is 30 s older than `now`; sync measures the silence when it looks, which a loaded machine
    # makes later (seen: 31.2 s under a full suite), never earlier.
    assert 30.0 <= float(silent.group(1)) <= 30.0 + (looked - now) + 0.05, line
    assert "> max(5 × 0.500 s/step, 10 s) = 10.0 s" in failure.evidence


def test_the_job_scripts_start_deadline_is_the_profiles_floor_or_the_smokes_build_times_its_margin(monkeypatch) -> None:
    """A trainer stuck before its first step is caught at max(hang.start_floor, start_margin × (the latest
    smoke's dataset + model build)): card A's smoke built in 23 + 39 s, so its 5 min floor stands; a build
    of 100 + 80 s gives 3 × 180 = 540 s."""
    from idmctl.core.checks import SmokeMeasurement
    from idmctl.job import derived

    profile = load_profile("card")[0]
    resolved = SimpleNamespace(hash="x")
    monkeypatch.setattr(derived, "latest_smoke", lambda _h: SmokeMeasurement(ok=True, dataset_s=23.0, model_s=39.0))
    assert derived.start_deadline(resolved, profile) == 300.0  # type: ignore[arg-type]
    monkeypatch.setattr(derived, "latest_smoke", lambda _h: SmokeMeasurement(ok=True, dataset_s=100.0, model_s=80.0))
    assert derived.start_deadline(resolved, profile) == 540.0  # type: ignore[arg-type]
    monkeypatch.setattr(derived, "latest_smoke", lambda _h: None)
    assert derived.start_deadline(resolved, profile) == profile.hang.start_floor_seconds == 300.0  # type: ignore[arg-type]
