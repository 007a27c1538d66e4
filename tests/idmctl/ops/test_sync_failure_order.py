"""The failure path in its natural order: sync classifies each ended job once, records its Failure rows,
then decides the retry from the record (the chain's earlier attempts from their rows, never their logs).

Real local jobs (the local executor, the real store, the real classifier); the classifier is only
wrapped to count its calls, and the decision to look at the store at the moment it is made.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from sqlmodel import select

from ground import contract
from idmctl.ops import retry
from idmctl.ops.executors.local import LocalExecutor
from idmctl.ops.failures import postmortem
from idmctl.ops.failures.classify import get_cause
from idmctl.record.db import session
from idmctl.record.models import Chain, Failure, Job

NAN = (f"{contract.FAILURE_MARKER} cause=nan_loss step=12", contract.EXIT_NAN)
EXCEPTION = ("Traceback (most recent call last):\n  File \"/home/team/idm/cache/dataset.py\", line 568, in __init__\n"
             "TypeError: __init__() got an unexpected keyword argument 'selected_layer_indices'", 1)
PREEMPTED = (f"entry: checkpointed at step 3 on signal, exiting {contract.EXIT_REQUEUE}", contract.EXIT_REQUEUE)


def _submit(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str,
            sample: tuple[str, int] | None) -> dict:
    """One local job: it prints ``sample``'s log and exits with its status (None: it completes)."""
    if sample is None:
        monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")
    else:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"log": sample[0], "exit": sample[1]}))
        monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"emit:{path}")
    result = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason", f"order {name}",
                 "--retries", "5", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _chain_jobs(chain_id: int) -> list[Job]:
    with session() as db:
        return list(db.exec(select(Job).where(Job.chain_id == chain_id).order_by(Job.attempt)))


def _sync(cli) -> dict:
    result = cli("sync", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _nan_chain_at_its_second_attempt(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Job]:
    """A chain whose first attempt NaN'd (classified, recorded, rolled back by one sync) and whose second
    attempt has NaN'd too, not synced yet."""
    first = _submit(cli, monkeypatch, tmp_path, "nan", NAN)  # the rollback attempt NaNs the same way
    executor = LocalExecutor()
    executor.wait(first["scheduler_id"], timeout_s=120)
    _sync(cli)
    jobs = _chain_jobs(first["chain"])
    assert [job.attempt for job in jobs] == [1, 2], [(job.attempt, job.state) for job in jobs]
    executor.wait(jobs[1].scheduler_id or "", timeout_s=120)
    return jobs


def _count_classifications(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Job id → how many times the real classifier was asked about it from now on."""
    classified: Counter[int] = Counter()
    real_classify_job = postmortem.classify_job

    def counting_classify_job(job, failed=None):
        classified[job.id] += 1
        return real_classify_job(job, failed)

    monkeypatch.setattr(postmortem, "classify_job", counting_classify_job)
    return classified


def test_one_sync_classifies_each_ended_job_once_and_decides_from_its_row(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Four jobs end before one sync: a chain's second NaN (its first already recorded), an exception, a
    preemption and a completed job. Each failed one is classified exactly once; the earlier NaN and the
    completed job not at all; every decision finds the job's Failure row already written."""
    nan_first, nan_second = _nan_chain_at_its_second_attempt(cli, monkeypatch, tmp_path)
    submitted = {name: _submit(cli, monkeypatch, tmp_path, name, sample)
                 for name, sample in (("exception", EXCEPTION), ("preempted", PREEMPTED), ("completes", None))}
    executor = LocalExecutor()
    for job in submitted.values():
        executor.wait(job["scheduler_id"], timeout_s=120)
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")  # what the preempted chain's resubmission does

    classified = _count_classifications(monkeypatch)
    plain_classify_calls: list[str] = []
    real_classify = postmortem.classify

    def counting_classify(state, **facts):
        plain_classify_calls.append(state)
        return real_classify(state, **facts)

    seen_at_decision: dict[int, dict[int, str]] = {}
    real_decide = retry.decide_for_job

    def looking_decide(records, job, chain, retry_allowed=True):
        seen_at_decision[job.id] = postmortem.recorded_causes(records.failures([job.id]))
        return real_decide(records, job, chain, retry_allowed)

    monkeypatch.setattr(postmortem, "classify", counting_classify)
    monkeypatch.setattr(retry, "decide_for_job", looking_decide)
    report = _sync(cli)

    ids = {name: job["job"] for name, job in submitted.items()}
    assert dict(classified) == {nan_second.id: 1, ids["exception"]: 1, ids["preempted"]: 1}
    assert len(plain_classify_calls) == 3  # no classification outside the one per ended job
    assert seen_at_decision == {nan_second.id: {nan_second.id: "nan_loss"},
                                ids["exception"]: {ids["exception"]: "python_exception"},
                                ids["preempted"]: {ids["preempted"]: "preempted"},
                                ids["completes"]: {}}
    # The decisions are the policy's, as before the reorder.
    assert sorted(report["finished"]) == sorted([nan_second.id, *ids.values()])
    stopped = dict((job_id, why) for job_id, why in report["stopped"])
    assert stopped[nan_second.id].startswith("nan_loss: already resubmitted 1× for nan_loss in this chain")
    assert stopped[ids["exception"]].startswith("python_exception: not retried (taxonomy action: stop)")
    assert [old for old, _ in report["resubmitted"]] == [ids["preempted"]]
    with session() as db:
        status = {chain.id: chain.status for chain in db.exec(select(Chain))}
    assert (status[nan_first.chain_id], status[submitted["exception"]["chain"]],
            status[submitted["preempted"]["chain"]], status[submitted["completes"]["chain"]]) == (
        "FAILED", "FAILED", "ACTIVE", "COMPLETED")
    executor.wait(str(_chain_jobs(submitted["preempted"]["chain"])[1].scheduler_id), timeout_s=120)


def test_the_decision_reads_the_cause_recorded_for_an_earlier_attempt(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nan_loss allows one rollback per chain. The first attempt's cause, corrected in the store to what it
    really was (a loader exception, say), is what the decision reads: the second NaN is then the chain's
    first and gets its rollback — where classifying the first attempt's log again would say nan_loss and
    stop the chain. The corrected row stays as written."""
    first, second = _nan_chain_at_its_second_attempt(cli, monkeypatch, tmp_path)
    with session() as db:
        rows = list(db.exec(select(Failure).where(Failure.job_id == first.id)))
        assert [row.cause for row in rows] == ["nan_loss"]
        rows[0].cause = "python_exception"
        db.add(rows[0])
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")  # the third attempt completes
    report = _sync(cli)
    jobs = _chain_jobs(first.chain_id or 0)
    assert [job.attempt for job in jobs] == [1, 2, 3]
    assert report["resubmitted"] == [[second.id, jobs[2].id]] and report["stopped"] == []
    assert f"export {contract.ENV_ROLLBACK}=1" in Path(jobs[2].script_path or "").read_text()
    with session() as db:
        assert [row.cause for row in db.exec(select(Failure).where(Failure.job_id == first.id))] == ["python_exception"]
    LocalExecutor().wait(jobs[2].scheduler_id or "", timeout_s=120)
    assert get_cause("nan_loss").max_per_chain == 1  # what makes the difference above


def test_an_earlier_attempt_never_recorded_is_recorded_before_the_decision(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A chain whose first attempt has no Failure row (a store written before sync recorded every end):
    the decision classifies and records it once, then counts it — the second NaN stops the chain."""
    first, second = _nan_chain_at_its_second_attempt(cli, monkeypatch, tmp_path)
    with session() as db:
        for row in db.exec(select(Failure).where(Failure.job_id == first.id)):
            db.delete(row)
    classified = _count_classifications(monkeypatch)
    report = _sync(cli)
    assert dict(classified) == {first.id: 1, second.id: 1}
    assert [job_id for job_id, _ in report["stopped"]] == [second.id] and report["resubmitted"] == []
    with session() as db:
        assert [row.cause for row in db.exec(select(Failure).where(Failure.job_id == first.id))] == ["nan_loss"]
