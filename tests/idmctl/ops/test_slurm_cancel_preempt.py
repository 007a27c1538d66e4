"""Clusters whose preemption cancels instead of requeueing: on the local cluster the QoS
`sub` is switched to PreemptMode=cancel inside the test only (the cluster is shared: restored in a
finally, the window kept to one preemption and one sync), then sync must resubmit the chain itself
and the new attempt resume from the checkpoint the preempted one wrote."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlmodel import select

from idmctl.record.db import session
from idmctl.record.models import Chain, Job
from slurm_support import cluster_changing, sh, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_home")]


def _qos(qos: str) -> dict[str, str]:
    """PreemptMode (lower case) and GraceTime in seconds: what ``sacctmgr modify qos`` takes back
    (it reads ``GraceTime=00:00:10`` as something else, so never hand it the display form)."""
    line = sh("sacctmgr", "-n", "-P", "show", "qos", qos, "format=PreemptMode,GraceTime").strip()
    mode, grace = line.split("|")
    seconds = sum(int(part) * 60 ** k for k, part in enumerate(reversed(grace.split(":")))) if grace else 0
    return {"PreemptMode": mode.lower(), "GraceTime": str(seconds)}


@contextmanager
def qos_settings(qos: str, **settings: str) -> Iterator[None]:
    """The QoS's settings changed for the block; the old ones restored (and checked) whatever happens.
    A change of the shared cluster: no reader test reads the QoS meanwhile."""
    with cluster_changing():
        before = _qos(qos)
        try:
            sh("sacctmgr", "-i", "modify", "qos", qos, "set", *(f"{k}={v}" for k, v in settings.items()))
            wait_until(lambda: all(_qos(qos)[k] == v for k, v in settings.items()), 30, f"QoS {qos} {settings}")
            yield
        finally:
            sh("sacctmgr", "-i", "modify", "qos", qos, "set", *(f"{k}={before[k]}" for k in settings))
            wait_until(lambda: _qos(qos) == before, 30, f"QoS {qos} restored to {before}")


def _submit(cli, experiment: str, *args: str) -> dict:
    result = cli("submit", experiment, "--force", "--reason", "slurm test", "--json", *args)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _chain_jobs(chain_id: int) -> list[Job]:
    with session() as db:
        return list(db.exec(select(Job).where(Job.chain_id == chain_id).order_by(Job.id)).all())


def _sync_until(cli, what: str, predicate, timeout_s: float = 120):
    def synced():
        result = cli("sync")
        assert result.exit_code == 0, result.output
        return predicate()

    return wait_until(synced, timeout_s, what, poll_s=1.0)


@pytest.mark.cluster_reader
def test_the_cluster_reports_its_preemption_mode_per_qos() -> None:
    from idmctl.ops.executors.preempt_mode import REQUEUE, preempt_mode

    assert preempt_mode("sub") == REQUEUE  # scripts/slurm/up.sh: QoS sub PreemptMode=requeue
    assert preempt_mode("core-own") == REQUEUE  # "cluster": the cluster-wide PreemptMode=REQUEUE


def test_where_preemption_cancels_sync_resubmits_the_chain_and_it_resumes(cli, monkeypatch) -> None:
    from idmctl.core.job_state import is_terminal
    from idmctl.ops.executors.preempt_mode import CANCEL, preempt_mode

    total_steps = 150  # 0.3 s each in the first attempt: long enough that the preemption lands while it runs
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"steps:{total_steps}:0.3")
    low = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--qos", "sub", "-c", "2", "--mem", "500MB",
                  "--exclude", "n2", "-J", "low-cancel")  # --retries 0: a resubmit may not spend a retry
    run_dir = Path(low["script"]).parent
    ckpt = run_dir / "ckpt.json"
    # The cluster is shared while developing: allow for a queue before the job starts.
    wait_until(lambda: ckpt.exists() and json.loads(ckpt.read_text())["step"] >= 3, 300, "3 steps of the sub job")
    # On this cluster the job script's own `scontrol requeue` rescues a cancelled job even at GraceTime 0
    # (tried: sacct PREEMPTED, then REQUEUED). Where preemption cancels, requeueing is typically not
    # allowed either: this job may not be requeued, so only sync can carry the chain on.
    sh("scontrol", "update", f"JobId={low['scheduler_id']}", "Requeue=0")
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:3:0.2")
    with qos_settings("sub", PreemptMode="cancel"):
        assert preempt_mode("sub") == CANCEL
        high = _submit(cli, "quickstart", "--entry", "tests.jobs_entry", "--qos", "core-own", "-c", "2",
                       "--mem", "500MB", "--exclude", "n2", "-J", "high-cancel")
        # What the resubmit inherits (sbatch exports sync's environment): the same steps, but quick ones,
        # since nothing preempts the second attempt: it only has to resume and finish.
        monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", f"steps:{total_steps}:0.02")

        def resubmitted() -> bool:
            jobs = _chain_jobs(low["chain"])
            assert jobs[0].state != "COMPLETED", "the sub job finished before it was preempted"
            return len(jobs) == 2

        _sync_until(cli, "sync to resubmit the preempted chain", resubmitted, timeout_s=90)
    first, second = _chain_jobs(low["chain"])
    # Slurm records FAILED 75:0 (the script exited after its refused requeue) or PREEMPTED (killed first).
    assert first.state in ("PREEMPTED", "FAILED") and is_terminal(first.state), (first.state, first.log_tail)
    from idmctl.ops.failures.postmortem import classify_job
    from idmctl.record.store import store

    assert classify_job(store().job(first.id)).cause == "preempted", first.log_tail  # type: ignore[arg-type]
    _sync_until(cli, "the resubmitted attempt to complete", lambda: is_terminal(_chain_jobs(low["chain"])[1].state), 180)
    second = _chain_jobs(low["chain"])[1]
    log = Path(second.log_path or "").read_text()
    assert second.state == "COMPLETED", log[-2000:]
    assert second.attempt == 2 and second.scheduler_id != first.scheduler_id
    resumed = [int(s) for s in re.findall(r"entry: resumed from step (\d+)", log)]
    assert resumed and resumed[0] >= 3, log  # from the preempted attempt's checkpoint, not step 0
    assert int((run_dir / "steps_done.txt").read_text()) == total_steps
    with session() as db:
        chain = db.get(Chain, low["chain"])
        assert chain is not None and (chain.status, chain.retries_used) == ("COMPLETED", 0)
    assert high["job"]
