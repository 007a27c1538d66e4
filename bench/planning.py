"""Planning before a run: a sweep's static preflight in one process, and ETAs in `idmctl jobs`.

Figures, each beside its reference measured in the same run:
- ``idmctl preflight SWEEP --no-smoke`` of a 12-variant sweep (one process: CLI start, the torch import
  of introspection and the store are paid once) against ``idmctl preflight latent_c_n4 --no-smoke``.
  Target: < 2× the single one.
- ``idmctl jobs --limit 1000`` with 1,000 RUNNING jobs, each with a progress.json to turn into an ETA,
  against the same listing with no progress files. Target: < 0.5 s.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from bench.common import Figure, time_call, time_command
from ground.contract import ENV_HOME

VENV_BIN = Path(sys.executable).parent
SWEEP = {"extends": "latent_c_n4", "description": "12 variants for the sweep benchmark",
         "sweep": {"grid": {"model.depth": [4, 8, 12], "train.lr": [1.0e-4, 2.0e-4], "loader.repeats": [1, 2]}}}


def _populate_running(home: Path, jobs: int, with_progress: bool) -> None:
    os.environ[ENV_HOME] = str(home)
    from ground.progress import Progress, write_progress
    from idmctl.record import session
    from idmctl.record.models import Chain, Job

    now = time.time()
    started = datetime.now(timezone.utc) - timedelta(hours=1)
    with session(home / "idmctl.sqlite") as db:
        chains = [Chain(experiment=f"exp_{i % 20}", spec_hash="h", retries_budget=3) for i in range(jobs)]
        db.add_all(chains)
        db.flush()
        db.add_all(Job(chain_id=c.id, experiment=c.experiment, scheduler_id=str(200000 + i), state="RUNNING",
                       submitted_at=started, started_at=started, qos="core-own", gpus=8,
                       script_path=str(home / "runs" / c.experiment / str(c.id) / "attempt-1.sbatch"),
                       options_json=json.dumps({"time_limit": "1-00:00:00"})) for i, c in enumerate(chains))
        ids = [(c.experiment, c.id) for c in chains]
    if with_progress:
        for i, (experiment, chain_id) in enumerate(ids):
            write_progress(home / "runs" / experiment / str(chain_id), Progress(
                step=100 + i, total=60_000, window_s_per_step=1.0 + i / jobs, window_steps=20, attempt_start_step=0,
                attempt_started_at=now - 3600, updated_at=now, spec_hash="h", code_version="c", timing_key="k"))


def _in_process_listing(home: Path, repeats: int) -> list[float]:
    """The listing without process start: what the ETAs add is file reads and arithmetic."""
    os.environ[ENV_HOME] = str(home)
    from typer.testing import CliRunner

    from idmctl.cli.app import app

    runner = CliRunner()
    runner.invoke(app, ["jobs", "--limit", "1000", "--json"])
    return time_call(lambda: runner.invoke(app, ["jobs", "--limit", "1000", "--json"]), repeats)


def run(fast: bool) -> list[Figure]:
    repeats = 1 if fast else 3  # a cold preflight process takes seconds on this shared machine
    jobs = 100 if fast else 1000
    idmctl = str(VENV_BIN / "idmctl")
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, ENV_HOME: str(Path(tmp) / "home")}
        sweep = Path(tmp) / "sweep12.yaml"
        sweep.write_text(yaml.safe_dump(SWEEP))
        single = time_command([idmctl, "preflight", "latent_c_n4", "--cluster", "card", "--no-smoke", "--json"],
                              repeats, env)
        many = time_command([idmctl, "preflight", str(sweep), "--cluster", "card", "--no-smoke", "--json"], repeats, env)
        figures.append(Figure("idmctl preflight of a 12-variant sweep --no-smoke (one process)", "s", many,
                              "idmctl preflight latent_c_n4 --no-smoke", single, target="< 2× the single preflight",
                              note="every variant's static checks, fixes and record; introspection imports torch once"))
    for with_progress in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / "home"
            _populate_running(home, jobs, with_progress)
            env = {**os.environ, ENV_HOME: str(home)}
            process = time_command([idmctl, "jobs", "--limit", str(jobs), "--json"], repeats if fast else 5, env)
            inproc = _in_process_listing(home, 1 if fast else 5)
        if not with_progress:
            plain, plain_in = process, inproc
            continue
        figures.append(Figure(f"idmctl jobs --json with ETAs, {jobs:,} running jobs (whole process)", "s", process,
                              "same listing, no progress files", plain, target="< 0.5 s",
                              note="reads each run's progress.json; process start included (rows read with sqlite3, no ORM)"))
        figures.append(Figure(f"idmctl jobs --json with ETAs, {jobs:,} running jobs (in process)", "s", inproc,
                              "same listing, no progress files", plain_in, target="< 0.5 s",
                              note="without interpreter and CLI start"))
    return figures


if __name__ == "__main__":
    for figure in run(fast="--fast" in sys.argv):
        print(figure.as_dict())
