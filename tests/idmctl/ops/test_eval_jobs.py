"""The evaluation job's entry (``python -m trainers.eval_job``) on a real tiny training run: it loads
one checkpoint, resumes nothing and logs into the chain's one MLflow run at that step; and ``--eval``
choices that name no checkpoint, or one retention will have pruned, are bad input before anything is
written. The job-level path (Slurm dependencies, a preempted chain) is tests/idmctl/ops/test_slurm_eval_jobs.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ground.paths import REPO_ROOT
from ground.contract import EXIT_REQUEUE, MLFLOW_RUN_ID_FILE
from test_train import mlflow_runs, prepare_run, run_trainer, trainer_env

torch.set_num_threads(1)


def run_eval(run_dir: Path, step: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainers.eval_job", "--run-dir", str(run_dir), "--step", str(step)],
                          capture_output=True, text=True, env=trainer_env(), cwd=REPO_ROOT, timeout=300)


@pytest.mark.slow
def test_eval_job_scores_a_checkpoint_into_the_chains_run_at_its_step(tiny_cache, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    run_dir = prepare_run(tiny_cache, tmp_path, "evaluated", train={"steps": 8, "checkpoint_every": 4, "keep_last": 2})
    trained = run_trainer(run_dir)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    status_before = client.get_run(run_id).info.status

    done = run_eval(run_dir, 4)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(mlflow_runs()) == 1  # the chain's run, never a new one
    run = client.get_run(run_id)
    assert run.info.status == status_before  # the training attempts own the run's status
    assert run.data.tags["idmctl.eval_job.step-4"].startswith("local pid ")
    at_step = sorted((m.timestamp, m.value) for m in client.get_metric_history(run_id, "eef_mm_2ep") if m.step == 4)
    # The trainer's own evaluation of that checkpoint, then the eval job's: same weights, episodes, seed.
    assert len(at_step) == 2 and at_step[1][1] == pytest.approx(at_step[0][1], rel=1e-4), at_step
    assert f"eval job: step 4: eef_mm_2ep {at_step[1][1]:.2f} mm" in done.stdout
    document = json.loads(Path(client.download_artifacts(run_id, "episodes/eef_mm_2ep/step-000000004.json")).read_text())
    assert document["step"] == 4 and len(document["episodes"]) == 2
    assert not (run_dir / "checkpoints" / "step-00000005.ckpt").exists()

    missing = run_eval(run_dir, 5)
    assert missing.returncode == 2
    assert "no checkpoint at step 5 (checkpoints present: 4, 8)" in missing.stderr
    assert "Traceback" not in missing.stderr

    # Slurm's notice before a preemption: the job script passes USR1 on, and the eval must exit EXIT_REQUEUE
    # (the script then requeues it) instead of dying of the signal (138: FAILED, never requeued).
    noticed = subprocess.Popen([sys.executable, "-m", "trainers.eval_job", "--run-dir", str(run_dir), "--step", "8"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=trainer_env(), cwd=REPO_ROOT)
    first = noticed.stdout.readline()  # printed once the handler is in place, before torch is imported
    assert first.startswith("eval job: step 8 of "), first
    noticed.send_signal(signal.SIGUSR1)
    out, err = noticed.communicate(timeout=300)
    assert noticed.returncode == EXIT_REQUEUE, (noticed.returncode, out, err[-2000:])
    assert f"eval job: SIGUSR1 received: exiting {EXIT_REQUEUE} to be requeued" in out
    assert "idmctl.eval_job.step-8" not in client.get_run(run_id).data.tags  # it never finished


def test_eval_choices_that_name_no_kept_checkpoint_are_bad_input(cli, tiny_cache, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlmodel import select

    from idmctl.record.db import session
    from idmctl.record.models import Job

    spec = tiny_cache.spec_file(tmp_path / "specs", "tiny_eval_bad", train={"steps": 12, "checkpoint_every": 4})
    result = cli("submit", str(spec), "--force", "--reason", "test", "--cluster", "local-slurm", "--eval", "5")
    assert result.exit_code == 2, result.output
    assert "--eval '5' is not a checkpoint this run writes (4, 8, 12; every 4 steps and the last)" in result.output
    result = cli("submit", str(spec), "--force", "--reason", "test", "--cluster", "local-slurm", "--eval", "each")
    assert result.exit_code == 2, result.output
    assert ("train.keep_last 2 keeps only steps 8, 12 at the end of training; the eval of step 4 would find its "
            "checkpoint pruned") in " ".join(result.output.split())
    result = cli("submit", str(spec), "--force", "--reason", "test", "--cluster", "local", "--eval", "last")
    assert result.exit_code == 2 and "--eval chains jobs with Slurm dependencies" in result.output, result.output
    # --dry-run --eval shows every script the submit would send, after the training one; a bad choice is still bad input.
    result = cli("submit", str(spec), "--cluster", "local-slurm", "--eval", "last", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "\n# ==== idmctl: then the eval job of step 12 (job 0 stands in for the training job's id) ====\n#!/bin/bash\n" \
        in result.stdout
    assert "#SBATCH --dependency=afterok:0\n" in result.stdout and "--step 12 &" in result.stdout
    result = cli("submit", str(spec), "--cluster", "local-slurm", "--eval", "5", "--dry-run")
    assert result.exit_code == 2 and "--eval '5' is not a checkpoint this run writes" in result.output, result.output
    result = cli("submit", str(spec), "--force", "--reason", "test", "--cluster", "local-slurm", "--eval", "last",
                 "--resume", "99")
    assert result.exit_code == 2 and "no chain 99" in result.output, result.output
    with session() as db:
        assert db.exec(select(Job)).all() == []


def test_an_eval_job_its_qos_refuses_stops_the_submit_before_anything_is_written(cli, tiny_cache, tmp_path: Path) -> None:
    """The eval job's own time limit (eval.resources) over local-slurm's core-own max wall: the submit is refused
    naming the eval job, before the training job or any row exists."""
    from sqlmodel import select

    from idmctl.record.db import session
    from idmctl.record.models import Job

    spec = tiny_cache.spec_file(tmp_path / "specs", "tiny_eval_long", train={"steps": 12, "checkpoint_every": 4},
                                eval={"resources": {"time_limit": "2-00:00:00"}})
    result = cli("submit", str(spec), "--cluster", "local-slurm", "--eval", "last")
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "submit refused: eval qos FAIL on the job as submitted" in said, said
    assert "eval job of step 12 (" in said and "time limit 2-00:00:00 > core-own max wall 1-00:00:00" in said, said
    with session() as db:
        assert db.exec(select(Job)).all() == []
