"""Two syncs at once decide an ended job once: a chain's controller job and a person's ``idmctl sync``
(or two controllers after a requeue) both look at the same preempted attempt.

Two real sync processes, real local jobs (the local executor), the real store (SQLite and the real
PostgreSQL), the real classifier, apprise and a real HTTP server receiving the notifications. The only
addition is a barrier after each sync's status call, so that both have read the job as unfinished and
both hold its ended status before either writes: the moment the race happens in, every time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import select

from ground.contract import ENV_NOTIFY
from idmctl.ops.executors.local import LocalExecutor
from idmctl.ops.sync import sync
from idmctl.record.db import session
from idmctl.record.models import Chain, Failure, Job
from test_notify import Webhook, _submit, webhook  # noqa: F401  (the fixture)
from test_sync_failure_order import PREEMPTED

BARRIER_TIMEOUT_S = 60
SYNC_PROCESS = """
import json, sys, time
from pathlib import Path
from idmctl.ops.executors.local import LocalExecutor
from idmctl.ops.sync import sync

barrier, me, timeout_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
real_status = LocalExecutor.status

def status_then_wait_for_the_other(self, scheduler_ids, submitted=None):
    found = real_status(self, scheduler_ids, submitted)
    (barrier / me).touch()  # both syncs now hold the ended status, neither has written
    deadline = time.monotonic() + timeout_s
    while len(list(barrier.iterdir())) < 2:
        if time.monotonic() > deadline:
            sys.exit(f"sync {me}: the other sync never reached its status call within {timeout_s:g} s")
        time.sleep(0.01)
    return found

LocalExecutor.status = status_then_wait_for_the_other
report = sync()
print(json.dumps({"finished": report.finished, "resubmitted": report.resubmitted, "stopped": report.stopped,
                  "elsewhere": report.elsewhere}))
"""


def _two_syncs_at_once(tmp_path: Path) -> list[dict]:
    """Two sync processes (as a controller job and a person's `idmctl sync` are), released together."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    syncs = [subprocess.Popen([sys.executable, "-c", SYNC_PROCESS, str(barrier), name, str(BARRIER_TIMEOUT_S)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    reports = []
    for process in syncs:
        out, err = process.communicate(timeout=BARRIER_TIMEOUT_S * 2)
        assert process.returncode == 0, err
        reports.append(json.loads(out.splitlines()[-1]))
    return reports


def test_two_syncs_at_once_resubmit_a_preempted_job_once(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         store_backend: str, webhook: Webhook) -> None:  # noqa: F811
    preempted = _submit(cli, monkeypatch, tmp_path, "preempted", PREEMPTED)
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")  # what the resubmission does
    monkeypatch.setenv(ENV_NOTIFY, webhook.url("/hooks/team"))

    reports = _two_syncs_at_once(tmp_path)

    resubmitted = [pair for report in reports for pair in report["resubmitted"]]
    assert len(resubmitted) == 1, reports
    [(old, new)] = resubmitted
    assert old == preempted["job"]
    winner, loser = sorted(reports, key=lambda report: len(report["resubmitted"]), reverse=True)
    assert winner["finished"] == [old] and winner["elsewhere"] == []
    assert loser == {"finished": [], "resubmitted": [], "stopped": [], "elsewhere": [old]}
    with session() as db:
        failures = db.exec(select(Failure).where(Failure.job_id == old)).all()
        jobs = db.exec(select(Job).where(Job.chain_id == preempted["chain"]).order_by(Job.attempt)).all()
        chain = db.get(Chain, preempted["chain"])
        assert [(f.cause, f.job_id) for f in failures] == [("preempted", old)]
        assert [(job.id, job.attempt) for job in jobs] == [(old, 1), (new, 2)]
        assert chain is not None and chain.retries_used == 1 and chain.status == "ACTIVE"
        assert jobs[0].end_recorded["by"]
        new_scheduler_id = jobs[1].scheduler_id or ""
    assert [m["event"] for m in webhook.messages("/hooks/team")] == ["failure"]
    LocalExecutor().wait(new_scheduler_id, timeout_s=120)  # the resubmission ends before its home goes


def test_the_loser_says_so_and_a_later_sync_finds_nothing_left_to_decide(cli, monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    preempted = _submit(cli, monkeypatch, tmp_path, "preempted", PREEMPTED)
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")
    reports = _two_syncs_at_once(tmp_path)
    [new] = [new for report in reports for _, new in report["resubmitted"]]
    with session() as db:
        new_row = db.get(Job, new)
        assert new_row is not None
        LocalExecutor().wait(new_row.scheduler_id or "", timeout_s=120)
    again = sync()
    assert again.finished == [new] and again.resubmitted == [] and again.elsewhere == []
    assert preempted["job"] not in again.finished
