"""`idmctl ledger`: card A's week replayed as store rows (test_failures_cli.add_card_a_jobs, the
records sync writes for its seven jobs), then preempted runs whose work a later run resumed: split by
the trainer's event record, or whole when the trainer exited 75 and left no record."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from ground.contract import EVENTS_FILE, EXIT_REQUEUE
from idmctl.record import session
from idmctl.record.models import Chain, Job
from test_failures_cli import T0, add_card_a_jobs

PREEMPTED_H = 4 * 59 / 60
"""6054/6108/6158: 4 GPUs from start (+1 min) to the preemption (+1 h), each."""


def _ledger(cli, *args: str) -> dict:
    result = cli("ledger", *args, "--json")
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.output)


def test_card_a_week_shows_where_the_gpu_hours_went(cli, store_backend) -> None:
    add_card_a_jobs()
    by_cause = _ledger(cli, "--by", "cause")
    groups = {g["group"]: g for g in by_cause["groups"]}
    # 5961 never started (6 days queued, 0 GPU-h); 6400 completed on 1 GPU in 1 min.
    assert {name: (g["runs"], g["charged_gpu_h"]) for name, g in groups.items()} == {
        "preempted": (3, round(3 * PREEMPTED_H, 4)),  # 3 × 4 GPU × 59 min = 11.8 GPU-h
        "loader_config": (1, 16.0),                    # 6262: 8 GPU × 2 h
        "python_exception": (1, 16.0),                 # 6321: 8 GPU × 2 h
        "shm_enospc": (1, 8.0),                        # 5845: 4 GPU × 2 h
        "completed": (1, round(1 / 60, 4)),            # 6400: 1 GPU × 1 min
    }
    total = by_cause["total"]
    assert total["charged_gpu_h"] == round(3 * PREEMPTED_H + 16 + 16 + 8 + 1 / 60, 4) == 51.8167
    assert total["useful_gpu_h"] == round(1 / 60, 4)
    assert total["lost_gpu_h_by_cause"] == {"loader_config": 16.0, "preempted": 11.8, "python_exception": 16.0,
                                            "shm_enospc": 8.0}
    # No preempted run ever checkpointed (the 2 h stage-in outlived the 1 h preempt cycle): all of it lost.
    assert (total["preemptions"], total["lost_gpu_h_per_preemption"]) == (3, round(PREEMPTED_H, 4))
    by_qos = {g["group"]: (g["charged_gpu_h"], g["useful_gpu_h"]) for g in _ledger(cli, "--by", "qos")["groups"]}
    assert by_qos == {"core-own": (round(32 + 1 / 60, 4), round(1 / 60, 4)), "sub": (round(3 * PREEMPTED_H + 8, 4), 0.0)}
    table = cli("ledger", "--by", "cause")
    assert table.exit_code == 0
    lines = [" ".join(line.replace("│", " ").split()) for line in table.output.splitlines()]
    assert "preempted 3 11.80 0.00 11.80 preempted 11.80 3 3.93 GPU-h" in lines
    assert "completed 1 0.02 0.02 0.00 — 0 —" in lines
    assert ("total 7 51.82 0.02 51.80 loader_config 16.00, python_exception 16.00, preempted 11.80, shm_enospc 8.00"
            " 3 3.93 GPU-h") in lines


def test_since_keeps_the_runs_that_ended_after_it(cli) -> None:
    add_card_a_jobs()
    after = _ledger(cli, "--by", "experiment", "--since", (T0 + timedelta(days=7)).isoformat())
    assert {g["group"]: g["runs"] for g in after["groups"]} == {"latent_c_n12_dense": 1, "latent_c_n4": 2}


def test_a_checkpoint_that_was_resumed_makes_its_run_useful(cli, store_backend) -> None:
    """Chain: attempt 1 preempted, its trainer checkpointed on the notice (exit 75) → attempt 2 resumed it and
    completed. A second chain's attempt was preempted without a checkpoint → lost, per preemption."""
    start = T0
    with session() as db:
        saved, unsaved = Chain(experiment="latent_c_n4", spec_hash="h"), Chain(experiment="latent_c_n4", spec_hash="h")
        db.add_all([saved, unsaved])
        db.flush()
        common = {"experiment": "latent_c_n4", "qos": "sub", "gpus": 2, "submitted_at": start}
        db.add(Job(chain_id=saved.id, attempt=1, state="PREEMPTED", exit_code=f"{EXIT_REQUEUE}:0", executor="local",
                   scheduler_id="local-a", started_at=start, ended_at=start + timedelta(hours=3), **common))
        db.add(Job(chain_id=saved.id, attempt=2, state="COMPLETED", exit_code="0:0", executor="local",
                   scheduler_id="local-b", started_at=start + timedelta(hours=4), ended_at=start + timedelta(hours=5),
                   **common))
        db.add(Job(chain_id=unsaved.id, attempt=1, state="PREEMPTED", exit_code="0:15", scheduler_id="71",
                   started_at=start, ended_at=start + timedelta(minutes=30), **common))
    total = _ledger(cli, "--by", "cause")["total"]
    assert (total["charged_gpu_h"], total["useful_gpu_h"]) == (2 * 3 + 2 * 1 + 2 * 0.5, 2 * 3 + 2 * 1)
    # Two preemptions: the checkpointed one lost nothing (no event record to split off its stage-in).
    assert (total["lost_gpu_h_by_cause"], total["preemptions"], total["lost_gpu_h_per_preemption"]) == (
        {"preempted": 1.0}, 2, 0.5)


def test_the_progress_record_splits_a_preempted_run_into_work_saved_and_lost(cli, tmp_path: Path) -> None:
    """Run 1 (4 GPUs, 3 h): stage-in until the trainer's start at +0.5 h, checkpoints at +1 h and +2.5 h,
    preempted at +3 h without a checkpoint at the notice; run 2 resumed and completed. Useful: start → last
    checkpoint = 2 h; lost to the preemption: 0.5 h stage-in + 0.5 h after the checkpoint."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    at = lambda hours: (T0 + timedelta(hours=hours)).isoformat()  # noqa: E731
    events = [("start", 0.5), ("checkpoint", 1.0), ("checkpoint", 2.5), ("start", 3.6), ("checkpoint", 4.0)]
    (run_dir / EVENTS_FILE).write_text("".join(json.dumps({"event": e, "at": at(h)}) + "\n" for e, h in events))
    with session() as db:
        chain = Chain(experiment="latent_c_n4", spec_hash="h")
        db.add(chain)
        db.flush()
        common = {"experiment": "latent_c_n4", "qos": "sub", "gpus": 4, "submitted_at": T0,
                  "script_path": str(run_dir / "job.sbatch"), "chain_id": chain.id}
        db.add(Job(attempt=1, state="PREEMPTED", exit_code="0:15", scheduler_id="81", started_at=T0,
                   ended_at=T0 + timedelta(hours=3), **common))
        db.add(Job(attempt=2, state="COMPLETED", exit_code="0:0", scheduler_id="82", started_at=T0 + timedelta(hours=3.5),
                   ended_at=T0 + timedelta(hours=4), **common))
    total = _ledger(cli, "--by", "qos")["total"]
    assert (total["charged_gpu_h"], total["useful_gpu_h"], total["lost_gpu_h_by_cause"]) == (
        4 * 3.5, 4 * 2.0 + 4 * 0.5, {"preempted": 4 * 1.0})
    assert (total["preemptions"], total["lost_gpu_h_per_preemption"]) == (1, 4.0)


def test_a_requeued_run_that_checkpointed_counts_as_useful(cli, store_backend) -> None:
    """One Slurm job requeued by its own script after the trainer's exit 75: sacct -D lists the REQUEUED run
    (its step exited 75) and the run that completed."""
    runs = [{"state": "REQUEUED", "exit_code": "0:0", "reason": None, "started_at": T0.isoformat(),
             "ended_at": (T0 + timedelta(hours=1)).isoformat(), "node_list": "n1",
             "steps": [["90.batch", "CANCELLED", "0:15"], ["90.0", "FAILED", f"{EXIT_REQUEUE}:0"]]},
            {"state": "COMPLETED", "exit_code": "0:0", "reason": None,
             "started_at": (T0 + timedelta(hours=2)).isoformat(), "ended_at": (T0 + timedelta(hours=3)).isoformat(),
             "node_list": "n2", "steps": [["90.batch", "COMPLETED", "0:0"], ["90.0", "COMPLETED", "0:0"]]}]
    with session() as db:
        db.add(Job(scheduler_id="90", experiment="latent_c_n4", state="COMPLETED", exit_code="0:0", restarts=1, gpus=4,
                   qos="sub", submitted_at=T0, started_at=T0, ended_at=T0 + timedelta(hours=3),
                   runs=runs))
    total = _ledger(cli)["total"]
    assert (total["runs"], total["charged_gpu_h"], total["useful_gpu_h"], total["preemptions"]) == (2, 8.0, 8.0, 1)
    assert total["lost_gpu_h_per_preemption"] == 0.0


@pytest.mark.parametrize("args,error", [
    (["--by", "node"], "error: --by: cannot group by 'node' (one of: experiment, qos, cause)"),
    (["--since", "last week"], "error: --since: not a date or a look-back: 'last week' (use e.g. 2026-11-01 or 7d)"),
])
def test_bad_input_is_one_line(cli, args: list[str], error: str) -> None:
    result = cli("ledger", *args)
    assert (result.exit_code, result.stderr.strip()) == (2, error)
