"""Every behaviour of the store's face (``idmctl.record.store.JobStore``) against each implementation: the
in-memory store, the SQL store on SQLite (driven by plain sqlite3 once at head, by SQLAlchemy while it is
new), and the SQL store on the real PostgreSQL (tests/pg_support.py; skipped where none runs, failed in CI)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ground.contract import ENV_DB_URL, ENV_HOME
from idmctl.core.job_state import JobState
from idmctl.record.memory_store import MemoryStore
from idmctl.record.records import ChainStatus, EvalLink, JobRecord, NewFailure, NodeExclusionRecord
from idmctl.record.store import (Decision, ImportedJob, JobStore, NewJob, Observation, SpecVersionRecord, TransitionRefused,
                                 UnknownRecord)

T0 = datetime(2026, 12, 7, 10, 0, 0, tzinfo=timezone.utc)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    from idmctl.record.sql_store import SqlStore

    monkeypatch.setenv(ENV_HOME, str(tmp_path / "home"))
    if request.param == "sqlite":
        monkeypatch.delenv(ENV_DB_URL, raising=False)
        yield SqlStore()
        return
    from pg_support import fresh_database

    with fresh_database() as url:
        monkeypatch.setenv(ENV_DB_URL, url)
        yield SqlStore()


def _job(store: JobStore, chain_id: int, attempt: int = 1, **more: object) -> NewJob:
    return NewJob(chain_id=chain_id, attempt=attempt, experiment="exp", executor="slurm", spec_hash="h1",
                  qos="normal", gpus=8, script_path="/runs/a/job.sbatch", options={"qos": "normal", "retries": 2},
                  admitted={"admission": {"failed": []}}, **more)  # type: ignore[arg-type]


def _seen(state: JobState, text: str | None = None, **more: object) -> Observation:
    return Observation(state=state, state_text=text or state.value, **more)  # type: ignore[arg-type]


def _running(store: JobStore, retries: int = 2) -> tuple[int, int]:
    chain = store.open_chain("exp", "h1", retries)
    job = store.submitting(_job(store, chain.id))
    store.submitted(job.id, "6054", "/runs/a/slurm-6054.out", T0)
    store.observed(job.id, _seen(JobState.RUNNING, started_at=T0 + timedelta(minutes=5), node_list="n1"))
    return chain.id, job.id


def test_a_chain_opens_active_and_registers_its_spec_once(store: JobStore) -> None:
    spec = SpecVersionRecord(hash="h1", experiment="exp", source_path="experiments/exp.yaml", resolved_json="{}")
    first = store.open_chain("exp", "h1", 3, spec=spec)
    second = store.open_chain("exp", "h1", 0, spec=spec)  # the same spec version: registered once, no error
    assert first.status is ChainStatus.ACTIVE and not first.status.is_terminal()
    assert (first.retries_budget, first.retries_used, first.retries_left) == (3, 0, 3)
    assert second.id != first.id and store.chain(second.id) == second
    assert store.chain(999) is None and store.job(999) is None


def test_a_chain_without_attempts_is_withdrawn_one_with_an_attempt_stays(store: JobStore) -> None:
    empty, used = store.open_chain("exp", "h1", 0), store.open_chain("exp", "h1", 0)
    store.submitting(_job(store, used.id))
    assert store.withdrawn(empty.id) and store.chain(empty.id) is None and not store.withdrawn(empty.id)
    assert not store.withdrawn(used.id) and store.chain(used.id) is not None


def test_submitting_then_submitted_is_a_typed_record(store: JobStore) -> None:
    chain = store.open_chain("exp", "h1", 2)
    job = store.submitting(_job(store, chain.id, eval_link=EvalLink(of_chain=7, step=400, after="6050", choice="last")))
    assert job.state is JobState.SUBMITTING and job.scheduler_id is None and job.attempt == 1
    assert job.options == {"qos": "normal", "retries": 2} and job.admitted == {"admission": {"failed": []}}
    assert job.eval_link == EvalLink(of_chain=7, step=400, after="6050", choice="last")
    assert job.eval_link.as_dict() == {"of_chain": 7, "step": 400, "after": "6050", "choice": "last"}
    assert store.eval_jobs(7) == [job] and store.eval_jobs(8) == []
    done = store.submitted(job.id, "6054", "/runs/a/slurm-6054.out", T0)
    assert (done.state, done.scheduler_id, done.submitted_at) == (JobState.PENDING, "6054", T0)
    assert store.job(job.id) == done and store.unfinished() == [done]
    with pytest.raises(TransitionRefused, match="submitted"):
        store.submitted(job.id, "6055", None, T0)  # only a SUBMITTING job takes its scheduler id


def test_a_refused_submission_fails_the_job_and_its_chain(store: JobStore) -> None:
    chain = store.open_chain("exp", "h1", 2)
    job = store.submitting(_job(store, chain.id))
    refused = store.refused(job.id, "sbatch: error: " + "x" * 600)
    assert refused.state is JobState.SUBMIT_FAILED and refused.is_terminal and len(refused.reason or "") == 500
    assert store.chain(chain.id).status is ChainStatus.FAILED  # type: ignore[union-attr]
    assert store.unfinished() == []
    with pytest.raises(TransitionRefused):
        store.submitting(_job(store, chain.id, attempt=2))  # a chain that is over takes no attempt
    with pytest.raises(TransitionRefused):
        store.refused(job.id, "again")


def test_a_person_resumes_an_ended_chain_but_not_a_running_one(store: JobStore) -> None:
    """``submit --resume``: the one move that makes a closed chain ACTIVE again, by hand, once nothing of it runs."""
    chain_id, job_id = _running(store)
    with pytest.raises(TransitionRefused, match=f"chain {chain_id} is still running \\(job {job_id}, RUNNING\\)"):
        store.resumed(chain_id)
    store.ended(job_id, _seen(JobState.FAILED, exit_code="1:0", ended_at=T0 + timedelta(hours=1)))
    store.decided(chain_id, Decision(close=ChainStatus.FAILED))
    assert store.chain(chain_id).status is ChainStatus.FAILED  # type: ignore[union-attr]
    assert store.resumed(chain_id).status is ChainStatus.ACTIVE
    assert store.submitting(_job(store, chain_id, attempt=2)).attempt == 2  # it takes the next attempt again
    with pytest.raises(UnknownRecord):
        store.resumed(chain_id + 100)


def test_an_eval_job_is_relinked_and_no_other_job_is(store: JobStore) -> None:
    """Sync moves an eval job onto the resubmitted attempt (``after``), or names the one standing in for it."""
    training_chain, training = _running(store)
    eval_chain = store.open_chain("exp", "h1", 0)
    link = EvalLink(of_chain=training_chain, step=100, after="6054", choice="last")
    job = store.submitting(_job(store, eval_chain.id, eval_link=link))
    moved = store.relinked(job.id, replace(link, after="6060"))
    assert moved.eval_link == replace(link, after="6060") and store.job(job.id) == moved
    assert store.relinked(job.id, replace(link, after="6060", moved_to=9)).eval_link.moved_to == 9  # type: ignore[union-attr]
    with pytest.raises(TransitionRefused):
        store.relinked(training, link)  # the training job has no link
    with pytest.raises(TransitionRefused):
        store.relinked(job.id, replace(link, of_chain=eval_chain.id))  # nor may a link change its chain


def test_observed_writes_the_status_and_stamps_the_update(store: JobStore) -> None:
    chain_id, job_id = _running(store)
    job = store.job(job_id)
    assert job is not None and job.state is JobState.RUNNING and job.node_list == "n1"
    assert job.started_at == T0 + timedelta(minutes=5)
    before = job.updated_at
    runs = ({"state": "PREEMPTED", "node_list": "n1"}, {"state": "RUNNING", "node_list": "n2"})
    later = store.observed(job_id, _seen(JobState.RUNNING, restarts=1, runs=runs, node_list="n2"))
    assert later.restarts == 1 and later.runs == runs and later.updated_at is not None and before is not None
    assert later.updated_at >= before
    unconfirmed = store.observed(job_id, _seen(JobState.UNCONFIRMED, reason="squeue says COMPLETED"))
    assert not unconfirmed.is_terminal and store.unfinished(chain_id=chain_id) == [unconfirmed]
    with pytest.raises(TransitionRefused, match="ended"):
        store.observed(job_id, _seen(JobState.FAILED))  # an end goes through `ended`, which claims it


def test_ended_claims_records_the_failures_and_is_never_left(store: JobStore) -> None:
    chain_id, job_id = _running(store)
    hang = store.record_failure(job_id, NewFailure("hang", "sync: no heartbeat", {"run": 1, "final": False}))
    assert not hang.final and hang.run == 1
    final = NewFailure("oom_host", "Slurm: State=OUT_OF_MEMORY", {"run": 1, "final": True})
    ended = store.ended(job_id, _seen(JobState.OUT_OF_MEMORY, exit_code="0:125", ended_at=T0 + timedelta(hours=1)),
                        [final], facts={"efficiency": {"cpu_eff": 0.5}, "committed_step": {"step": 400}})
    assert ended is not None and ended.state is JobState.OUT_OF_MEMORY and ended.end_claim is not None
    assert ended.efficiency == {"cpu_eff": 0.5} and ended.committed_step == {"step": 400}
    (failure,) = store.failures([job_id])  # the run's hang row reclassified in place
    assert (failure.id, failure.cause, failure.final) == (hang.id, "oom_host", True)
    assert store.unfinished() == [] and not store.claim_end(job_id)
    with pytest.raises(TransitionRefused, match="terminal"):
        store.ended(job_id, _seen(JobState.COMPLETED))
    with pytest.raises(TransitionRefused, match="terminal"):
        store.observed(job_id, _seen(JobState.RUNNING))  # a terminal state is never left
    assert store.job(job_id).state is JobState.OUT_OF_MEMORY  # type: ignore[union-attr]


def test_an_end_claimed_elsewhere_writes_nothing(store: JobStore) -> None:
    _, job_id = _running(store)
    assert store.claim_end(job_id) and not store.claim_end(job_id)
    ended = store.ended(job_id, _seen(JobState.COMPLETED))  # this process holds the claim: it records the end
    assert ended is not None and ended.state is JobState.COMPLETED


def test_decided_closes_spends_and_excludes_and_a_closed_chain_stays_closed(store: JobStore) -> None:
    chain_id, job_id = _running(store, retries=1)
    until = T0 + timedelta(hours=24)
    spent = store.decided(chain_id, Decision(spend_retry=True, exclude=[NodeExclusionRecord("n1", until, "ecc")]))
    assert (spent.status, spent.retries_used, spent.retries_left) == (ChainStatus.ACTIVE, 1, 0)
    assert store.exclusions("ecc") == [NodeExclusionRecord("n1", until, "ecc")] and store.exclusions("other") == []
    closed = store.decided(chain_id, Decision(close=ChainStatus.FAILED))
    assert closed.status is ChainStatus.FAILED and closed.status.is_terminal()
    with pytest.raises(TransitionRefused):
        store.decided(chain_id, Decision(close=ChainStatus.COMPLETED))
    with pytest.raises(TransitionRefused):
        store.decided(chain_id, Decision(spend_retry=True))
    with pytest.raises(UnknownRecord):
        store.decided(999, Decision(close=ChainStatus.COMPLETED))


def test_cancelling_stops_the_chain_of_a_running_job_and_a_refused_cancel_puts_it_back(store: JobStore) -> None:
    chain_id, job_id = _running(store)
    job, before = store.cancelling(job_id)
    assert job.id == job_id and before is not None and before.status is ChainStatus.ACTIVE
    assert store.chain(chain_id).status is ChainStatus.CANCELLED  # type: ignore[union-attr]
    assert store.cancel_refused(chain_id, before.status).status is ChainStatus.ACTIVE  # type: ignore[union-attr]
    assert store.job(job_id).state is JobState.RUNNING  # type: ignore[union-attr]  # the job itself never moved
    # a chain that is over stays as it is: cancelling marks only an ACTIVE chain, and the undo leaves a
    # chain no longer CANCELLED alone
    store.decided(chain_id, Decision(close=ChainStatus.FAILED))
    assert store.cancelling(job_id)[1].status is ChainStatus.FAILED  # type: ignore[union-attr]
    assert store.chain(chain_id).status is ChainStatus.FAILED  # type: ignore[union-attr]
    assert store.cancel_refused(chain_id, ChainStatus.ACTIVE).status is ChainStatus.FAILED  # type: ignore[union-attr]
    assert store.cancel_refused(999, ChainStatus.ACTIVE) is None
    other = store.open_chain("exp", "h1", 0)
    unsent = store.submitting(_job(store, other.id))
    with pytest.raises(TransitionRefused, match="never submitted"):
        store.cancelling(unsent.id)
    with pytest.raises(UnknownRecord):
        store.cancelling(999)
    store.ended(job_id, _seen(JobState.CANCELLED, ended_at=T0 + timedelta(hours=1)))
    with pytest.raises(TransitionRefused, match="already ended CANCELLED"):
        store.cancelling(job_id)


def test_facts_merge_the_run_is_kept_once_and_a_notice_is_claimed_once(store: JobStore) -> None:
    chain_id, job_id = _running(store)
    store.note(job_id, "controller", {"scheduler_id": "6060", "after": "6054"})
    noted = store.note(job_id, "controller", {"last_run": {"ok": True}})
    assert noted.controller == {"scheduler_id": "6060", "after": "6054", "last_run": {"ok": True}}
    with pytest.raises(KeyError):
        store.note(job_id, "state", "COMPLETED")  # a state moves by a transition, never as a fact
    assert store.note_chain_run(chain_id, "run-a").mlflow_run_id == "run-a"
    assert store.note_chain_run(chain_id, "run-b").mlflow_run_id == "run-a"
    assert store.claim_notice(job_id, "stopped") and not store.claim_notice(job_id, "stopped")
    assert store.claim_notice(job_id, "resubmitted") and set(store.job(job_id).notified) == {"stopped", "resubmitted"}  # type: ignore[union-attr]


def test_attempts_and_unfinished_filter(store: JobStore) -> None:
    chain_id, first = _running(store)
    second = store.submitting(_job(store, chain_id, attempt=2))
    store.submitted(second.id, "6099", None, T0)
    assert [j.attempt for j in store.attempts(chain_id)] == [1, 2]
    assert [j.id for j in store.attempts(chain_id, before=2)] == [first]
    assert [j.id for j in store.unfinished(chain_id=chain_id)] == [first, second.id]
    assert store.unfinished(chain_id=chain_id + 100) == []
    mine = store.job(first).user  # type: ignore[union-attr]
    assert len(store.unfinished(user=mine)) == 2 and store.unfinished(user="nobody-else") == []


def test_the_records_are_frozen(store: JobStore) -> None:
    _, job_id = _running(store)
    job = store.job(job_id)
    assert job is not None
    with pytest.raises(AttributeError):
        job.state = JobState.FAILED  # type: ignore[misc]
    assert replace(job, state=JobState.FAILED) != job and store.job(job_id) == job


def test_imported_jobs_are_stored_once_with_their_failures(store: JobStore) -> None:
    def classify(job: JobRecord) -> list[NewFailure]:
        seen.append(job.scheduler_id)
        return [] if job.state is JobState.COMPLETED else [NewFailure("oom_host", f"Slurm: State={job.state_text}",
                                                                      {"run": 1, "final": True})]

    seen: list[str | None] = []
    oom = ImportedJob("6054", "card_a", "OUT_OF_MEMORY", exit_code="0:125", ended_at=T0, user="alice")
    first = store.imported([oom, ImportedJob("6055", "card_a", "COMPLETED", ended_at=T0)], classify)
    assert [(j.scheduler_id, j.state, j.imported, j.chain_id, len(f)) for j, f in first] == [
        ("6054", JobState.OUT_OF_MEMORY, True, None, 1), ("6055", JobState.COMPLETED, True, None, 0)]
    (oom_job, (failure,)), (done, _) = first
    assert oom_job.user == "alice" and done.user == store.job(done.id).user  # type: ignore[union-attr]
    assert store.failures([oom_job.id]) == [failure] and failure.evidence == "Slurm: State=OUT_OF_MEMORY"
    again = store.imported([oom, ImportedJob("6056", "card_a", "CANCELLED by 0")], classify)
    assert [job.state_text for job, _ in again] == ["CANCELLED by 0"] and seen == ["6054", "6055", "6056"]
    assert len(store.failures([oom_job.id])) == 1  # a known job is left alone (not classified again)


def test_pending_classification_the_failure_table_and_a_fix(store: JobStore) -> None:
    chain_id, job_id = _running(store)
    other = store.submitting(_job(store, chain_id, attempt=2))
    store.submitted(other.id, "6060", None, T0)
    assert [j.id for j in store.to_classify()] == [job_id, other.id]  # not completed: may hold a failed run
    store.ended(job_id, _seen(JobState.FAILED, exit_code="1:0", ended_at=T0 + timedelta(hours=2)))
    assert job_id in [j.id for j in store.to_classify()]  # ended, no failure classified since
    (written,) = store.classified(job_id, [NewFailure("python_exception", "Traceback", {"run": 1, "final": True})])
    assert job_id not in [j.id for j in store.to_classify()]  # classified at or after its last change
    assert [j.id for j in store.with_scheduler_id("6054")] == [job_id] and store.with_scheduler_id("nope") == []
    rows, total = store.failure_table()
    assert total == 1 and [(f.id, j.id, fix) for f, j, fix in rows] == [(written.id, job_id, None)]
    assert store.failure_table(cause="oom_host") == ([], 0) and store.failure_table(experiment="other") == ([], 0)
    fix = store.fixed([job_id], "use core-own", "abc123")
    ((failure, job, shown),) = store.failure_table(newest=5)[0]
    assert (shown, failure.fix_id, job.state_text) == (fix, fix.id, "FAILED") and fix.note == "use core-own"
    (again,) = store.classified(job_id, [NewFailure("oom_host", "OOM", {"run": 1, "final": True})])
    assert (again.id, again.cause, again.fix_id) == (written.id, "oom_host", fix.id)  # reclassified in place, fix kept


def test_reading_a_store_that_is_not_there_finds_nothing_and_creates_nothing(store: JobStore) -> None:
    from ground.paths import db_path

    assert store.job(1) is None and store.chain(1) is None and store.unfinished() == [] and store.to_classify() == []
    assert store.failure_table() == ([], 0) and store.exclusions() == [] and store.with_scheduler_id("6054") == []
    assert not db_path().exists()  # SQLite: a dry run, a refused submit or a bad IDMCTL_HOME leave no store
