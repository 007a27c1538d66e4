"""Crash loops: two consecutive attempts of a chain that fail without committing a newer checkpoint are
``crash_loop`` and stop the chain. Real store rows, real run directories and logs as the job script and the
watchdog write them (tests/idmctl/ops/test_slurm_controller.py runs the same on the local Slurm)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlmodel import select

from ground.run_events import CHECKPOINT, CHECKPOINT_CORRUPT, append_event, event_line
from idmctl.ops.failures.postmortem import classify_pending, recorded_causes
from idmctl.ops.failures.progress import attempt_end, committed_step
from idmctl.ops.retry import Decision, decide_for_job
from idmctl.record import session
from idmctl.record.models import Chain, Failure, Job
from idmctl.record.sql_store import failure_record
from idmctl.record.store import store

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=timezone.utc)

CRASH_LOOP_TABLE = """\
┏━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┓
┃ job  ┃ experiment ┃ setting ┃ cause      ┃ evidence                                                            ┃ fix                                                                 ┃ caught now by ┃
┡━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━┩
│ 7004 │ quickstart │ share   │ crash_loop │ crash loop: attempt 1 (job 7003) hang at step none, then attempt 2  │ open — suggested: read both attempts' logs (`idmctl failures        │ none          │
│      │            │         │            │ (job 7004) hang at step none; newest committed checkpoint still     │ --cause crash_loop`, then `idmctl jobs show`); fix what fails       │               │
│      │            │         │            │ step none                                                           │ before the first checkpoint (or checkpoint sooner), then `idmctl    │               │
│      │            │         │            │                                                                     │ submit EXP --resume CHAIN`                                          │               │
└──────┴────────────┴─────────┴────────────┴─────────────────────────────────────────────────────────────────────┴─────────────────────────────────────────────────────────────────────┴───────────────┘
"""


def _hang_log(job_id: str, node: str, steps: list[int]) -> str:
    """What the job script and the watchdog print when a trainer deadlocks after ``steps``."""
    lines = [f"idmctl: job {job_id} chain 1 attempt 1 restart 0 on {node} at 2026-11-30T03:00:01+00:00"]
    lines += [f"IDMCTL_STEP step={s} loss=0.5000 seconds=0.200" for s in steps]
    lines += ["IDMCTL_FAILURE cause=hang step=3 silent_s=12.0 threshold_s=10.0",
              "idmctl: trainer exited 86 at 2026-11-30T03:01:00+00:00"]
    return "\n".join(lines) + "\n"


def _attempt(db, chain: Chain, attempt: int, run_dir: Path, job_id: str, node: str, steps: list[int],
             before: str = "") -> Job:
    log = before + _hang_log(job_id, node, steps)
    log_path = run_dir / f"slurm-{job_id}.out"
    log_path.write_text(log)
    start = T0 + timedelta(minutes=5 * attempt)
    job = Job(scheduler_id=job_id, chain_id=chain.id, attempt=attempt, experiment="quickstart", state="FAILED",
              exit_code="86:0", node_list=node, qos="share", submitted_at=start, started_at=start,
              ended_at=start + timedelta(minutes=1), script_path=str(run_dir / f"attempt-{attempt}.sbatch"),
              log_path=str(log_path), options_json=json.dumps({"retries": 3}))
    job.committed_step = attempt_end(job.script_path, log)  # what sync records when the attempt ends, before classifying it
    db.add(job)
    db.commit()  # the store classifies what is committed (its own connection)
    classify_pending(store())
    return job


def _causes(db, jobs: list[Job]) -> dict[int, str]:
    """The recorded causes of these jobs, read in the test's open session."""
    rows = db.exec(select(Failure).where(Failure.job_id.in_([job.id for job in jobs])))  # type: ignore[union-attr]
    return recorded_causes([failure_record(row.model_dump()) for row in rows])


def _decide(job: Job, chain: Chain) -> Decision:
    """What sync decides for the job, from the store (after the test's session committed)."""
    records = store()
    return decide_for_job(records, records.job(job.id), records.chain(chain.id))  # type: ignore[arg-type]


def test_committed_step_reads_published_checkpoints_and_checkpoint_events(tmp_path: Path) -> None:
    assert committed_step(tmp_path) == (None, "no checkpoint in checkpoints/ or events.jsonl")
    append_event(tmp_path, CHECKPOINT, step=4)
    assert committed_step(tmp_path) == (4, "events.jsonl")
    (tmp_path / "checkpoints" / "step-00000009.ckpt").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-00000011.ckpt.tmp").mkdir()  # a save cut short: never committed
    assert committed_step(tmp_path) == (9, "checkpoints/")


def test_two_attempts_without_a_newer_checkpoint_stop_the_chain_as_crash_loop(cli, tmp_path: Path) -> None:
    progressed, stuck = tmp_path / "runs" / "quickstart" / "1", tmp_path / "runs" / "quickstart" / "2"
    for run_dir in (progressed, stuck):
        run_dir.mkdir(parents=True)
    for step in (1, 2, 3):
        append_event(progressed, CHECKPOINT, step=step)
    with session() as db:
        chains = [Chain(experiment="quickstart", spec_hash="h", retries_budget=3) for _ in range(2)]
        db.add_all(chains)
        db.flush()
        # Attempt 1 committed steps 1-3, attempt 2 resumed from 3 and hung before another: one attempt
        # without progress is no loop.
        _attempt(db, chains[0], 1, progressed, "7001", "n1", [1, 2, 3])
        resumed = _attempt(db, chains[0], 2, progressed, "7002", "n2", [])
        assert resumed.committed_step["step"] == 3
        assert _causes(db, [resumed]) == {resumed.id: "hang"}
        # Attempts 3 and 4 (another chain) both hang before their first checkpoint.
        first = _attempt(db, chains[1], 1, stuck, "7003", "n1", [])
        assert _causes(db, [first]) == {first.id: "hang"}
        second = _attempt(db, chains[1], 2, stuck, "7004", "n2", [])
        (row,) = db.exec(select(Failure).where(Failure.job_id == second.id)).all()
    decision = _decide(second, chains[1])
    assert row.cause == "crash_loop"
    detail = json.loads(row.detail_json)
    assert detail["loop_of"] == "hang"
    assert [(a["attempt"], a["job"], a["cause"], a["last_step"], a["committed_step"]) for a in detail["attempts"]] == [
        (1, "7003", "hang", None, None), (2, "7004", "hang", None, None)]
    assert row.evidence.splitlines()[1] == ("crash loop: attempt 1 (job 7003) hang at step none, then attempt 2 "
                                            "(job 7004) hang at step none; newest committed checkpoint still step none")
    # Budget left (3 retries; hang's own max_per_chain is 2): the crash loop stops it after two attempts.
    assert (decision.action, decision.cause) == ("stop", "crash_loop")
    # `idmctl failures` shows it, as the table's evidence line.
    result = cli("failures", "--cause", "crash_loop")
    assert result.exit_code == 0, result.output
    assert result.output == CRASH_LOOP_TABLE


def test_a_resume_that_fell_back_shows_in_the_failure_evidence(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    corrupt = event_line(CHECKPOINT_CORRUPT, step=6, file="checkpoints/step-00000006.ckpt/state.ckpt",
                         reason="sha256", moved_to="checkpoints/corrupt/step-00000006.ckpt")
    fell_back = f"{corrupt}\nresumed from checkpoints/step-00000003.ckpt at step 3\n"
    with session() as db:
        chain = Chain(experiment="quickstart", spec_hash="h", retries_budget=3)
        db.add(chain)
        db.flush()
        job = _attempt(db, chain, 1, run_dir, "7101", "n1", [4], before=fell_back)
        (row,) = db.exec(select(Failure).where(Failure.job_id == job.id)).all()
    assert row.cause == "hang"
    assert ("resume: checkpoint_corrupt step=6 file=checkpoints/step-00000006.ckpt/state.ckpt reason=sha256 "
            "moved_to=checkpoints/corrupt/step-00000006.ckpt") in row.evidence.splitlines()
    assert json.loads(row.detail_json)["events"][0]["event"] == CHECKPOINT_CORRUPT


def test_checkpoint_then_fail_twice_the_same_way_is_a_crash_loop(tmp_path: Path) -> None:
    """Attempt 1 starts from nothing, commits step 3 and then hangs at step 5; attempt 2 resumes from step 3 and
    hangs at step 5 again without a newer checkpoint: a loop, though attempt 1 saved one before failing.
    Another chain whose second attempt hangs at another step (not the same way) is no loop yet."""
    looping, elsewhere = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    for run_dir in (looping, elsewhere):
        run_dir.mkdir(parents=True)
        append_event(run_dir, CHECKPOINT, step=3)  # what attempt 1 commits before it fails
    with session() as db:
        chains = [Chain(experiment="quickstart", spec_hash="h", retries_budget=5) for _ in range(2)]
        db.add_all(chains)
        db.flush()
        first = _attempt(db, chains[0], 1, looping, "7201", "n1", [1, 2, 3, 4, 5])
        assert first.committed_step == {"step": 3, "source": "events.jsonl", "last_step": 5}
        second = _attempt(db, chains[0], 2, looping, "7202", "n2", [4, 5])
        (row,) = db.exec(select(Failure).where(Failure.job_id == second.id)).all()
        _attempt(db, chains[1], 1, elsewhere, "7203", "n1", [1, 2, 3, 4, 5])
        other = _attempt(db, chains[1], 2, elsewhere, "7204", "n2", [4])
        assert _causes(db, [other]) == {other.id: "hang"}
    decision = _decide(second, chains[0])
    assert row.cause == "crash_loop"
    assert row.evidence.splitlines()[1] == ("crash loop: attempt 1 (job 7201) hang at step 5, then attempt 2 "
                                            "(job 7202) hang at step 5; newest committed checkpoint still step 3")
    assert (decision.action, decision.cause) == ("stop", "crash_loop")
