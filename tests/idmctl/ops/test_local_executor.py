"""The local executor runs the same rendered script as a subprocess, with Slurm's states and the same
records; sync and retries-by-cause work on it exactly as on Slurm."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlmodel import select

from ground.contract import EXIT_REQUEUE
from idmctl.ops.executors.local import LocalExecutor
from idmctl.record.db import session
from idmctl.record.models import Chain, Job


def _submit(cli, *args: str) -> dict:
    result = cli("submit", "quickstart", "--entry", "tests.jobs_entry", "--force", "--reason", "executor test",
                 "--json", *args)
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _wait(scheduler_id: str) -> None:
    LocalExecutor().wait(scheduler_id, timeout_s=60)


def _jobs() -> list[Job]:
    with session() as db:
        return list(db.exec(select(Job).order_by(Job.id)).all())


def _chain(chain_id: int) -> Chain:
    with session() as db:
        chain = db.get(Chain, chain_id)
        assert chain is not None
        return chain


def test_completed_job_is_recorded_with_times_and_log(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:3:0.05")
    submitted = _submit(cli)
    assert submitted["executor"] == "local" and submitted["forced"] is True
    _wait(submitted["scheduler_id"])
    assert cli("sync").exit_code == 0
    (job,) = _jobs()
    assert (job.state, job.exit_code, job.reason) == ("COMPLETED", "0:0", None)
    assert job.started_at is not None and job.ended_at is not None and job.ended_at >= job.started_at
    assert "entry: done 3 steps" in (job.log_tail or "")
    assert job.forced_reason and job.forced_reason.endswith(": executor test")
    assert json.loads(job.options_json)["qos"] == "core-own"
    assert _chain(job.chain_id).status == "COMPLETED"
    listing = cli("jobs")
    assert "COMPLETED" in listing.output and submitted["scheduler_id"] in listing.output


def test_type_error_at_start_fails_and_is_not_retried_even_with_budget(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "typeerror")
    submitted = _submit(cli, "--retries", "5")
    _wait(submitted["scheduler_id"])
    result = cli("sync")
    assert "python_exception" in result.output
    jobs = _jobs()
    assert [(j.state, j.exit_code) for j in jobs] == [("FAILED", "1:0")]
    chain = _chain(jobs[0].chain_id)
    assert (chain.status, chain.retries_budget, chain.retries_used) == ("FAILED", 5, 0)


def test_checkpointed_exit_is_resubmitted_into_the_chain_and_resumes(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:40:0.1")
    submitted = _submit(cli, "--retries", "1")
    run_dir = Path(submitted["script"]).parent
    deadline = time.monotonic() + 30
    while not (run_dir / "ckpt.json").exists() or json.loads((run_dir / "ckpt.json").read_text())["step"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # What Slurm's preemption notice does: USR1 to the batch shell, which passes it to the trainer.
    runner_pid = json.loads((Path(submitted["log"]).parent.parent.parent.parent / "local-jobs"
                             / f"{submitted['scheduler_id']}.json").read_text())["runner_pid"]
    import os
    import signal
    script_pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == runner_pid]
    for pid in script_pids:
        os.kill(pid, signal.SIGUSR1)
    _wait(submitted["scheduler_id"])
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:5:0.05")  # the resumed attempt finishes quickly
    report = json.loads(cli("sync", "--json").stdout)
    assert len(report["resubmitted"]) == 1
    first, second = _jobs()
    assert (first.state, first.exit_code) == ("PREEMPTED", f"{EXIT_REQUEUE}:0")
    assert (second.chain_id, second.attempt) == (first.chain_id, 2)
    _wait(second.scheduler_id)
    cli("sync")
    first, second = _jobs()
    assert second.state == "COMPLETED"
    import re
    resumed = re.findall(r"entry: resumed from step (\d+)", second.log_tail or "")
    assert resumed and int(resumed[-1]) >= 3, second.log_tail  # not step 0
    assert int((run_dir / "steps_done.txt").read_text()) == 5
    assert _chain(first.chain_id).status == "COMPLETED"
    assert _chain(first.chain_id).retries_used == 1


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_submit_requires_a_passing_preflight(cli, tiny_cache) -> None:
    # The data is real, so every submit-time check passes and only the gate refuses.
    result = cli("submit", str(tiny_cache.spec_path), "--entry", "tests.jobs_entry")
    assert result.exit_code == 1, result.output
    assert "preflight required: no preflight for tiny_routed" in result.stderr
    assert "--entry tests.jobs_entry`" in result.stderr  # the preflight to run carries the smoke flag
    assert _jobs() == []


def test_submit_passes_the_gate_with_a_recorded_preflight(cli, tiny_cache, monkeypatch: pytest.MonkeyPatch) -> None:
    from idmctl.record.preflights import code_version, record_run
    from idmctl.core.profile import load_profile
    from ground.spec.loader import load_spec

    resolved = load_spec(str(tiny_cache.spec_path))
    profile, profile_hash = load_profile("local")
    # A pass of the spec as written does not cover --entry (it changes the code that runs) ...
    record_run(resolved, profile.name, profile_hash, code_version(), [], with_smoke=True, seconds=0.1)
    refused = cli("submit", str(tiny_cache.spec_path), "--entry", "tests.jobs_entry", "--json")
    assert refused.exit_code == 1 and "no preflight of tiny_routed with --entry tests.jobs_entry" in refused.stderr
    assert _jobs() == []
    # ... a pass recorded with it does.
    run = record_run(resolved, profile.name, profile_hash, code_version(), [], with_smoke=True, seconds=0.1,
                     job={"smoke_flags": {"--entry": "tests.jobs_entry"}})
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")
    result = cli("submit", str(tiny_cache.spec_path), "--entry", "tests.jobs_entry", "--json")
    assert result.exit_code == 0, result.stderr
    _wait(json.loads(result.stdout)["scheduler_id"])
    (job,) = _jobs()
    assert (job.preflight_id, job.forced_reason) == (run.id, None)
    admitted = job.admitted
    assert admitted["admission"]["preflight_id"] == run.id and admitted["admission"]["failed"] == []
    assert [c["name"] for c in admitted["admission"]["checks"]] == [
        "spec", "introspection", "loader", "shm", "io", "qos", "disk", "cache", "smoke"]
    assert admitted["job"]["smoke_flags"] == {"--entry": "tests.jobs_entry"}


def test_watch_syncs_until_every_job_ended_and_cancel_stops_a_chain(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:2:0.05")
    quick = _submit(cli)
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:500:0.1")
    slow = _submit(cli, "--retries", "3")
    assert cli("cancel", str(slow["job"])).exit_code == 0
    result = cli("watch", "--interval", "0.3")
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].endswith(" 0 unfinished")
    states = {job.id: job.state for job in _jobs()}
    assert states == {quick["job"]: "COMPLETED", slow["job"]: "CANCELLED"}
    assert _chain(slow["chain"]).status == "CANCELLED"
    again = cli("cancel", str(slow["job"]))
    assert again.exit_code == 1 and "already ended CANCELLED" in again.stderr


def test_the_local_scheduler_verdict_is_bash_n_and_dry_run_shows_it(cli, idmctl_home: Path) -> None:
    """Where there is no scheduler to ask, submit asks bash whether the script parses: a script that
    does not is refused in bash's own words (the renderer never writes one; a hand edit might)."""
    from idmctl.ops.verdict import SchedulerRefused, require_acceptance, scheduler_verdict

    dry = cli("submit", "quickstart", "--dry-run", "--cluster", "local")
    assert dry.exit_code == 0, dry.stderr
    assert "scheduler (bash -n) accepts the job: the script parses (no scheduler to ask)" in dry.stderr
    broken = scheduler_verdict("local", dry.stdout.replace("\nfi\n", "\n", 1))
    assert not broken.accepted and broken.command == "bash -n" and "syntax error" in broken.words, broken
    assert "\n" not in broken.words
    with pytest.raises(SchedulerRefused, match=r"^submit refused by the scheduler \(bash -n\): .*syntax error"):
        require_acceptance("local", "if true; then\n")
    assert not (idmctl_home / "runs").exists()
