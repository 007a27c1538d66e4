"""The Fabric trainer end to end on real tiny data: learning + MLflow, 2 gloo ranks, preempt/resume, NaN.

Every run is the real entry point (``python -m trainers.train --run-dir DIR``) in a subprocess.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ground.paths import REPO_ROOT
from net_support import free_port
from ground.spec.loader import load_spec
from trainers.checkpoint import complete_checkpoints, state_file
from ground.run_dir import write_run_spec
from ground import tracking
from ground.contract import (CAUSE_NAN_LOSS, ENV_ATTEMPT, ENV_INJECT_NAN_AT_STEP, ENV_RANK_DIGESTS, ENV_ROLLBACK,
                             EXIT_NAN, EXIT_REQUEUE, FAILURE_FILE, FAILURE_MARKER, MLFLOW_RUN_ID_FILE, EVENTS_FILE)

torch.set_num_threads(1)


def trainer_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO_ROOT), **extra}
    return env


def prepare_run(tiny_cache, tmp_path: Path, name: str, **overrides: dict) -> Path:
    spec_path = tiny_cache.spec_file(tmp_path / "specs", name, **overrides)
    run_dir = tmp_path / name
    write_run_spec(run_dir, load_spec(str(spec_path)))
    return run_dir


def run_trainer(run_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainers.train", "--run-dir", str(run_dir)], capture_output=True,
                          text=True, env=trainer_env(**env), cwd=REPO_ROOT, timeout=300)


def mlflow_runs() -> list:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri
    from ground.tracking import MLFLOW_EXPERIMENT

    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def metric_history(run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    history = MlflowClient(tracking_uri=mlflow_tracking_uri()).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)


def final_weights(run_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    step, path = complete_checkpoints(run_dir)[-1]
    state = torch.load(state_file(path), weights_only=True)
    assert state["step"] == step
    return step, state["model"]


@pytest.mark.slow
def test_train_command_learns_and_logs_to_mlflow(tiny_cache, tmp_path: Path, cli) -> None:
    spec_path = tiny_cache.spec_file(tmp_path, "tiny_learn", train={"steps": 40, "lr": 1e-2, "log_every": 10,
                                                                    "checkpoint_every": 20},
                                     model={"hidden_dim": 32, "kv_dim": 32})
    run_dir = tmp_path / "run"
    result = cli("train", str(spec_path), "--run-dir", str(run_dir))
    assert result.exit_code == 0, result.output
    assert "step 40/40" in result.output and "eval at step 40: eef_mm_2ep" in result.output
    [run] = mlflow_runs()
    assert run.info.status == "FINISHED"
    assert run.info.run_id == (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    assert run.info.run_name == "tiny_learn"
    assert run.data.tags[tracking.TAG_SPEC_HASH] == load_spec(str(spec_path)).hash
    assert run.data.params["model.hidden_dim"] == "32" and run.data.params["train.steps"] == "40"
    losses = metric_history(run.info.run_id, "loss")
    assert [step for step, _ in losses] == [10, 20, 30, 40]
    # Each point is the mean loss of its 10 steps; the last two windows sit clearly below the first.
    assert (losses[-1][1] + losses[-2][1]) / 2 < 0.85 * losses[0][1], losses
    for key in ("lr", "step_time_s", "samples_per_s", "data_wait_frac", "peak_mem_bytes"):
        assert len(metric_history(run.info.run_id, key)) == 4, key
    eef = metric_history(run.info.run_id, "eef_mm_2ep")
    assert [step for step, _ in eef] == [20, 40]
    assert run.data.metrics["best_eef_mm_2ep"] == min(value for _, value in eef)
    assert [step for step, _ in complete_checkpoints(run_dir)] == [20, 40]
    # Each evaluation's per-episode errors, under the protocol the tag names; their mean is the metric.
    import json

    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri

    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    assert [a.path for a in client.list_artifacts(run.info.run_id, "episodes/eef_mm_2ep")] == [
        "episodes/eef_mm_2ep/step-000000020.json", "episodes/eef_mm_2ep/step-000000040.json"]
    document = json.loads((Path(client.download_artifacts(run.info.run_id, "episodes/eef_mm_2ep/step-000000040.json"))
                           ).read_text())
    assert run.data.tags[tracking.protocol_tag("eef_mm_2ep")] == document["protocol"]["name"]
    assert document["protocol"]["name"].startswith("offline:") and document["protocol"]["name"].endswith("/valid:2ep")
    assert len(document["protocol"]["episodes"]) == 2 and document["protocol"]["seeds"] == [0]
    errors = [episode["error_mm"] for episode in document["episodes"]]
    assert sum(errors) / 2 == pytest.approx(eef[-1][1], rel=1e-6)


@pytest.mark.slow
def test_two_cpu_ranks_over_gloo_end_with_identical_parameters(tiny_cache, tmp_path: Path) -> None:
    run_dir = prepare_run(tiny_cache, tmp_path, "tiny_ddp", resources={"cpu_ranks": 2},
                          train={"steps": 6, "checkpoint_every": 6, "log_every": 3})
    done = run_trainer(run_dir, **{ENV_RANK_DIGESTS: "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "world 2, grad_accum 1" in done.stdout
    digests = {path.name: path.read_text().strip() for path in (run_dir / "rank_digests").iterdir()}
    assert sorted(digests) == ["rank-0.sha256", "rank-1.sha256"]
    assert digests["rank-0.sha256"] == digests["rank-1.sha256"]
    # Gradients were synchronised, not merely never applied: training moved the weights.
    from trainers.registry import build_model

    torch.manual_seed(0)
    initial = build_model(load_spec(str(tmp_path / "specs" / "tiny_ddp.yaml")).spec)
    _, trained = final_weights(run_dir)
    assert any(not torch.equal(initial.state_dict()[k], trained[k]) for k in trained)


@pytest.mark.slow
def test_sigusr1_then_resume_equals_an_uninterrupted_run_in_one_mlflow_run(tiny_cache, tmp_path: Path) -> None:
    overrides = {"train": {"steps": 40, "checkpoint_every": 100, "log_every": 1}}
    straight = prepare_run(tiny_cache, tmp_path, "straight", **overrides)
    assert run_trainer(straight).returncode == 0

    interrupted = tmp_path / "interrupted"
    write_run_spec(interrupted, load_spec(str(tmp_path / "specs" / "straight.yaml")))
    process = subprocess.Popen([sys.executable, "-m", "trainers.train", "--run-dir", str(interrupted)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=trainer_env(**{ENV_ATTEMPT: "1"}), cwd=REPO_ROOT)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("step 3/"):
            process.send_signal(signal.SIGUSR1)
            break
    rest = process.stdout.read()
    assert process.wait(timeout=120) == EXIT_REQUEUE
    assert "stop signal received" in rest
    [(stopped_at, _)] = complete_checkpoints(interrupted)
    assert 3 <= stopped_at < 40

    resumed = run_trainer(interrupted, **{ENV_ATTEMPT: "2"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step-{stopped_at:08d}.ckpt at step {stopped_at}" in resumed.stdout

    # The event record the ledger splits GPU-hours by: each attempt's start, then its checkpoints.
    progress = [json.loads(line) for line in (interrupted / EVENTS_FILE).read_text().splitlines()]
    assert [(e["event"], e.get("step")) for e in progress] == [
        ("start", None), ("checkpoint", stopped_at), ("start", None), ("checkpoint", 40)]
    assert [e["at"] for e in progress] == sorted(e["at"] for e in progress)

    step_a, weights_a = final_weights(straight)
    step_b, weights_b = final_weights(interrupted)
    assert step_a == step_b == 40
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)

    run_id = (interrupted / MLFLOW_RUN_ID_FILE).read_text().strip()
    runs = {run.info.run_id: run for run in mlflow_runs()}
    assert len(runs) == 2  # the straight run and the interrupted chain: one run each
    chain = runs[run_id]
    assert chain.info.status == "FINISHED" and chain.data.tags[tracking.TAG_ATTEMPT] == "2"
    assert [step for step, _ in metric_history(run_id, "loss")][-1] == 40


def test_resumed_data_order_skips_by_index(tiny_cache) -> None:
    from cache.registry import build_dataloader
    from trainers.train import micro_batches

    spec = load_spec(str(tiny_cache.spec_path)).spec
    loader = build_dataloader(spec, "train", shuffle=True, seed=7)
    per_epoch = len(loader)
    straight = list(itertools.islice(micro_batches(loader, 0), 2 * per_epoch + 3))
    resumed = list(itertools.islice(micro_batches(loader, per_epoch + 2), per_epoch + 1))
    key = [(b["demo"], b["start"].tolist()) for b in straight[per_epoch + 2:]]
    assert key == [(b["demo"], b["start"].tolist()) for b in resumed]
    assert straight[0]["demo"] != straight[per_epoch]["demo"] or straight[0]["start"].tolist() != straight[per_epoch]["start"].tolist()


def test_run_directory_refuses_another_spec(tiny_cache, tmp_path: Path) -> None:
    from ground.errors import UserError

    run_dir = prepare_run(tiny_cache, tmp_path, "first")
    other = load_spec(str(tiny_cache.spec_file(tmp_path / "specs", "second", train={"steps": 9})))
    with pytest.raises(UserError, match="run directory holds spec first"):
        write_run_spec(run_dir, other)


def test_too_few_held_out_episodes_fail_at_start_up(tiny_cache, tmp_path: Path) -> None:
    run_dir = prepare_run(tiny_cache, tmp_path, "tiny_eval5", eval={"metric": "eef_mm_5ep", "episodes": [5]})
    done = run_trainer(run_dir)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: eval.episodes: eval asks for 5 episodes but split 'valid' has 2 "
        "(use counts ≤ 2 or add held-out demos)")
    assert not (run_dir / "checkpoints").exists()
    assert mlflow_runs() == []  # refused before the MLflow run was opened


def test_a_half_written_checkpoint_is_never_resumed(tmp_path: Path) -> None:
    from trainers.checkpoint import checkpoint_path, latest_checkpoint

    complete = checkpoint_path(tmp_path, 4)
    complete.parent.mkdir(parents=True)
    torch.save({"step": 4}, complete)
    # What a kill during fabric.save leaves behind: the temp name, truncated.
    (complete.parent / ".step-00000008.ckpt.tmp").write_bytes(b"PK\x03\x04 truncated")
    assert latest_checkpoint(tmp_path) == complete


@pytest.mark.slow
def test_an_injected_nan_stops_at_once_fails_again_when_rerun_and_a_rollback_skips_its_batches(tiny_cache,
                                                                                                 tmp_path: Path) -> None:
    # One run directory through three starts, each a real trainer process: the NaN attempt, a plain rerun,
    # the rerun with the rollback flag.
    run_dir = prepare_run(tiny_cache, tmp_path, "tiny_nan", train={"steps": 6, "checkpoint_every": 1})
    done = run_trainer(run_dir, **{ENV_INJECT_NAN_AT_STEP: "3"})
    assert done.returncode == EXIT_NAN, done.stderr[-3000:]
    assert f"{FAILURE_MARKER} cause=nan_loss step=3" in done.stderr.splitlines()
    assert json.loads((run_dir / FAILURE_FILE).read_text()) == {"cause": "nan_loss", "step": 3}
    assert [step for step, _ in complete_checkpoints(run_dir)] == [1, 2]
    assert not list((run_dir / "checkpoints").glob(".*"))  # no half-written temp file either
    _, weights = final_weights(run_dir)
    assert all(torch.isfinite(w).all() for w in weights.values())
    [run] = mlflow_runs()
    assert run.info.status == "FAILED" and run.data.tags[tracking.TAG_FAILURE_CAUSE] == CAUSE_NAN_LOSS

    # Without the rollback flag the same hook fails the same step again: the flag is what changes it.
    again = run_trainer(run_dir, **{ENV_INJECT_NAN_AT_STEP: "3"})
    assert again.returncode == EXIT_NAN, again.stderr[-3000:]
    assert [step for step, _ in complete_checkpoints(run_dir)] == [1, 2]

    rolled = run_trainer(run_dir, **{ENV_INJECT_NAN_AT_STEP: "3", ENV_ROLLBACK: "1"})
    assert rolled.returncode == 0, rolled.stderr[-3000:]
    assert "rollback: resumed at step 2, skipping the batches of steps 3..3" in rolled.stdout + rolled.stderr
    assert [step for step, _ in complete_checkpoints(run_dir)][-1] == 6
    _, weights = final_weights(run_dir)
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.slow
def test_a_resume_from_an_older_checkpoint_supersedes_the_points_after_it(tiny_cache, tmp_path: Path) -> None:
    """Attempt 1 logs steps 1..10 and stops at step 11 (a NaN: no checkpoint of it; a node that died hard
    looks the same) with its last checkpoint at step 8. Attempt 2, the chain's rollback, resumes from 8
    and logs 9..12 into the same MLflow run. MLflow keeps both attempts' points for 9 and 10 (its issue
    #4248); compare and the plots read each step once, from the attempt that counts."""
    from mlflow.tracking import MlflowClient

    from ground.paths import mlflow_tracking_uri
    from idmctl.track.compare import load_runs, surviving_history

    run_dir = prepare_run(tiny_cache, tmp_path, "tiny_older", train={"steps": 12, "checkpoint_every": 4, "log_every": 1})
    first = run_trainer(run_dir, **{ENV_ATTEMPT: "1", ENV_INJECT_NAN_AT_STEP: "11"})
    assert first.returncode == EXIT_NAN, first.stderr[-3000:]
    assert [step for step, _ in complete_checkpoints(run_dir)][-1] == 8
    run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    client = MlflowClient(tracking_uri=mlflow_tracking_uri())
    assert max(step for step, _ in metric_history(run_id, tracking.M_LOSS)) == 10

    resumed = run_trainer(run_dir, **{ENV_ATTEMPT: "2", ENV_INJECT_NAN_AT_STEP: "11", ENV_ROLLBACK: "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step-00000008.ckpt at step 8" in resumed.stdout

    raw = [step for step, _ in metric_history(run_id, tracking.M_LOSS)]
    assert raw.count(9) == raw.count(10) == 2  # what MLflow itself shows: overlapping curves
    curve = surviving_history(client, run_id, tracking.M_LOSS)
    assert [step for step, _ in curve] == list(range(1, 13))  # each step once
    started_again = max(m.timestamp for m in client.get_metric_history(run_id, tracking.M_ATTEMPT_START))
    for step in (9, 10):  # the rollback attempt's point, not the first attempt's
        [kept] = [m.value for m in client.get_metric_history(run_id, tracking.M_LOSS)
                  if m.step == step and m.timestamp >= started_again]
        assert dict(curve)[step] == kept
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, tracking.M_ATTEMPT_START)) == [
        (0, 1.0), (8, 2.0)]
    assert client.get_run(run_id).data.tags[tracking.TAG_ATTEMPT_START_STEP] == "8"
    [row] = load_runs()
    assert row.metrics[tracking.M_LOSS].points == 12 and row.steps_done == 12


def test_surviving_points_drop_what_a_later_attempt_retrained_or_never_reached() -> None:
    # Attempt 1 (fresh, t=0) logs steps 1..10; attempt 2 (t=100) resumes from 8 and is killed after 9;
    # attempt 3 (t=200) resumes from 4 and completes 5..12.
    points = [(k, k, 1.0) for k in range(1, 11)] + [(100 + k, k, 2.0) for k in (9,)]
    starts = [(0, 0), (100, 8), (200, 4)]
    assert tracking.surviving(points, starts[:2]) == [*[(k, 1.0) for k in range(1, 9)], (9, 2.0)]
    points += [(200 + k, k, 3.0) for k in range(5, 13)]
    assert tracking.surviving(points, starts) == [*[(k, 1.0) for k in range(1, 5)], *[(k, 3.0) for k in range(5, 13)]]
    assert tracking.surviving(points[:10], []) == [(k, 1.0) for k in range(1, 11)]  # a run logged before markers



EARLY_NOTICE = """
import os, runpy, signal, sys
original = signal.signal
sent = []
def install(signum, handler):
    result = original(signum, handler)
    if signum == signal.SIGTERM and not sent:  # the trainer's first stop handler is in place: notice now
        sent.append(1)
        print(f"notice sent, torch imported: {'torch' in sys.modules}", flush=True)
        os.kill(os.getpid(), signal.SIGUSR1)
    return result
signal.signal = install
sys.argv = ["trainers.train", "--run-dir", sys.argv[1]]
runpy.run_module("trainers.train", run_name="__main__")
"""


def test_a_preemption_notice_during_start_up_still_ends_in_a_requeue(tiny_cache, tmp_path: Path) -> None:
    """USR1 while torch is still importing (seconds on a loaded node) must not kill the trainer: it is
    remembered, and the first step boundary checkpoints and exits 75 like any later notice. The notice
    is sent the moment the trainer installs its first stop handler, which must be before torch loads."""
    run_dir = prepare_run(tiny_cache, tmp_path, "early_signal", train={"steps": 40, "checkpoint_every": 100})
    done = subprocess.run([sys.executable, "-c", EARLY_NOTICE, str(run_dir)], capture_output=True, text=True,
                          env=trainer_env(**{ENV_ATTEMPT: "1"}), cwd=REPO_ROOT, timeout=300)
    assert "notice sent, torch imported: False" in done.stdout, done.stdout[-2000:]
    assert done.returncode == EXIT_REQUEUE, (done.stdout + done.stderr)[-3000:]
    assert "stop signal received" in done.stdout
    [(stopped_at, _)] = complete_checkpoints(run_dir)
    assert 1 <= stopped_at < 40
