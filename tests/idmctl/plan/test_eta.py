"""Live ETA from the run directory's progress.json: the arithmetic, `idmctl jobs`/`watch`, and a real training
job on the local Slurm cluster."""

from __future__ import annotations

from ground.contract import PROGRESS_FILE

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ground.progress import Progress, read_progress, write_progress
from idmctl.plan.eta import estimate


def _progress(step: int, total: int, rate: float | None, *, updated_at: float = 1000.0) -> Progress:
    return Progress(step=step, total=total, window_s_per_step=rate, window_steps=20 if rate else 0,
                    attempt_start_step=0, attempt_started_at=900.0, updated_at=updated_at, spec_hash="h",
                    code_version="c", timing_key="k")


def test_eta_within_the_limit() -> None:
    eta = estimate(_progress(400, 1000, 0.5), started_at=900.0, time_limit_s=1800.0, retries_left=2, now=1000.0)
    # 600 steps × 0.5 s = 300 s → finish at 1,300 s; the limit ends at 900 + 1,800 = 2,700 s.
    assert (eta.eta_s, eta.finish_at, eta.limit_at, eta.attempts_needed, eta.warning) == (300.0, 1300.0, 2700.0, 0, None)
    assert eta.finish_text(1000.0) == "ETA 5.0 min, 23.3 min before the limit"


def test_eta_past_the_limit_warns_with_attempts_against_the_retry_budget() -> None:
    eta = estimate(_progress(100, 10_000, 2.0), started_at=900.0, time_limit_s=3600.0, retries_left=1, now=1000.0)
    # 9,900 × 2 s = 19,800 s → finish 20,800; limit at 4,500 → 16,300 s over = 4.5 limits → 5 more attempts.
    assert eta.attempts_needed == 5
    assert eta.warning == ("finish 4.5 h past the time limit (9,900 steps × 2 s/step = 5.5 h, 58.3 min left): "
                           "needs 5 more attempt(s), retry budget 1 — NOT ENOUGH")


def test_progress_file_is_tolerated_before_it_exists_and_round_trips(tmp_path: Path) -> None:
    assert read_progress(tmp_path) is None
    (tmp_path / PROGRESS_FILE).write_text('{"step": 3')  # never happens (atomic writes), still not a crash
    assert read_progress(tmp_path) is None
    write_progress(tmp_path, _progress(5, 10, 0.25))
    assert read_progress(tmp_path) == _progress(5, 10, 0.25)


def _running_job(idmctl_home: Path, experiment: str, time_limit: str, retries: int,
                 started_s_ago: float) -> tuple[int, int]:
    from idmctl.record.db import session
    from idmctl.record.models import Chain, Job

    started = datetime.fromtimestamp(time.time() - started_s_ago, tz=timezone.utc)
    with session() as db:
        chain = Chain(experiment=experiment, spec_hash="h", retries_budget=retries)
        db.add(chain)
        db.flush()
        run_dir = idmctl_home / "runs" / experiment / str(chain.id)
        job = Job(chain_id=chain.id, experiment=experiment, executor="slurm", scheduler_id="77", state="RUNNING",
                  started_at=started, submitted_at=started, options_json=json.dumps({"time_limit": time_limit}),
                  script_path=str(run_dir / "attempt-1.sbatch"))
        db.add(job)
        db.flush()
        return int(job.id), int(chain.id)


def test_jobs_and_watch_show_step_rate_eta_and_warn_past_the_limit(cli, idmctl_home: Path) -> None:
    now = time.time()
    fast, fast_chain = _running_job(idmctl_home, "fast", "1:00:00", 0, 60)
    slow, slow_chain = _running_job(idmctl_home, "slow", "0:10:00", 2, 60)
    write_progress(idmctl_home / "runs" / "fast" / str(fast_chain), Progress(
        step=500, total=1000, window_s_per_step=1.0, window_steps=20, attempt_start_step=0, attempt_started_at=now - 55,
        updated_at=now, spec_hash="h", code_version="c", timing_key="k"))
    write_progress(idmctl_home / "runs" / "slow" / str(slow_chain), Progress(
        step=10, total=1000, window_s_per_step=3.0, window_steps=10, attempt_start_step=0, attempt_started_at=now - 55,
        updated_at=now, spec_hash="h", code_version="c", timing_key="k"))
    listing = json.loads(cli("jobs", "--json").stdout)
    by_job = {r["job"]: r["eta"] for r in listing}
    assert (by_job[fast]["step"], by_job[fast]["total"], by_job[fast]["s_per_step"]) == (500, 1000, 1.0)
    assert by_job[fast]["warning"] is None and by_job[fast]["eta_s"] == 500.0
    # 990 × 3 s = 49.5 min, the 10 min limit ends in ~9 min: 40.5 min over → 5 more attempts of 10 min; budget 2.
    assert by_job[slow]["attempts_needed"] == 5 and "NOT ENOUGH" in by_job[slow]["warning"]
    table = cli("jobs").stdout
    fast_row = next(line for line in table.splitlines() if "│ fast " in line)
    assert "500/1,000" in fast_row and "1.000 s (last 20)" in fast_row and "ETA 8.3 min" in fast_row
    assert "WARN finish" in table
    from idmctl.cli.commands.jobs import print_etas
    from idmctl.cli.output import console

    with console.capture() as captured:
        print_etas(now)
    lines = captured.get().splitlines()
    assert any(line.startswith(f"  job {fast} fast: step 500/1,000, 1.000 s (last 20), ETA 8.3 min, ")
               and line.endswith(" before the limit") for line in lines)
    assert any(line.startswith(f"  job {slow} slow: step 10/1,000, 3.000 s (last 10), ETA 49.5 min; WARN finish ")
               for line in lines)


@pytest.mark.slow
@pytest.mark.slurm
def test_real_training_job_on_slurm_reports_its_eta_and_the_limit_warning(cli, tiny_cache, slurm_home: Path) -> None:
    """The real trainer under Slurm writes progress.json; `idmctl jobs` turns it into an ETA that passes
    the 5-minute limit (a million steps), so it WARNs; then the job is cancelled. The limit leaves room for
    a trainer that starts slowly with both cores busy (a 1-minute limit ended the job before its fifth
    logged step under load)."""
    from slurm_support import sacct_state, text_so_far, wait_until

    home = slurm_home
    try:
        spec = tiny_cache.spec_file(home / "specs", "tiny_eta", resources={"cpus": 1, "mem": "1500MB",
                                                                          "time_limit": "0:05:00"},
                                    train={"steps": 1_000_000, "checkpoint_every": 1_000_000, "log_every": 5})
        result = cli("submit", str(spec), "--force", "--reason", "eta test", "--json")
        assert result.exit_code == 0, result.output
        submitted = json.loads(result.stdout)
        log = Path(submitted["log"])
        run_dir = Path(submitted["script"]).parent

        def measured() -> dict | None:
            assert cli("sync", "--no-retry").exit_code == 0
            progress = read_progress(run_dir)
            if progress is None or not progress.window_s_per_step or progress.window_steps < 5:
                return None
            rows = json.loads(cli("jobs", "--json").stdout)
            return rows[0]["eta"] if rows and rows[0]["state"] == "RUNNING" and rows[0]["eta"] else None

        def seen() -> str:
            state = sacct_state(str(submitted["scheduler_id"]))
            return (f"a running job with a measured step time (job {submitted['scheduler_id']} {state or '?'}, "
                    f"progress {read_progress(run_dir)}, log {log}: {text_so_far(log)[-800:]!r})")

        eta = wait_until(measured, 240, seen, poll_s=1.0)
        assert eta["total"] == 1_000_000 and 0 < eta["step"] < 1_000_000 and eta["s_per_step"] > 0
        assert eta["warning"] and "past the time limit" in eta["warning"], (eta, text_so_far(log)[-1500:])
        assert eta["limit_at"] is not None and eta["finish_at"] > eta["limit_at"]
    finally:
        cli("cancel", str(json.loads(cli("jobs", "--json").stdout)[0]["job"])) if (home / "idmctl.sqlite").exists() else None


def test_plain_sqlite_listing_equals_the_orm_listing(cli, idmctl_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`idmctl jobs` reads with sqlite3 (no ORM import); the rows must be exactly what the ORM path lists."""
    job_id, chain_id = _running_job(idmctl_home, "fast", "1:00:00", 1, 60)
    write_progress(idmctl_home / "runs" / "fast" / str(chain_id), _progress(5, 10, 0.5, updated_at=time.time()))
    from idmctl.record import jobs as job_rows

    fast = json.loads(cli("jobs", "--json").stdout)
    assert job_rows.read_jobs_fast(idmctl_home / "idmctl.sqlite", 30) is not None
    monkeypatch.setattr(job_rows, "read_jobs_fast", lambda *args: None)  # the ORM path, as on a store without one
    orm = json.loads(cli("jobs", "--json").stdout)
    for rows in (fast, orm):  # ETAs depend on the moment of the call
        for row in rows:
            for key in ("eta_s", "finish_at", "updated_s_ago"):
                row["eta"].pop(key)
    assert fast == orm and fast[0]["job"] == job_id and fast[0]["eta"]["step"] == 5
