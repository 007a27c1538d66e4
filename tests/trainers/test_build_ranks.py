"""Builders as one process per device: rank from srun's or torchrun's variables, threads from the
allocation, and N ranks over gloo writing exactly the files one process writes (bitwise, on the CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ground.errors import UserError
from ground.ranks import SINGLE, Ranks, cpu_threads, ranks_from_env

SRUN_TASK_1_OF_4 = {  # what job 1349's srun task on the second node saw, for a 2 × 2 layout
    "SLURM_JOB_ID": "1349", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_CPUS_PER_TASK": "3",
}


def test_srun_task_reads_its_rank_local_rank_and_node_share() -> None:
    assert ranks_from_env(SRUN_TASK_1_OF_4) == Ranks(rank=3, world=4, local_rank=1, local_world=2, launcher="srun")
    uneven = {**SRUN_TASK_1_OF_4, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_PROCID": "3", "SLURM_LOCALID": "0"}
    assert ranks_from_env(uneven).local_world == 1  # node 1 of "3,1" holds one task


def test_torchrun_wins_over_the_srun_task_it_runs_in() -> None:
    env = {**SRUN_TASK_1_OF_4, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert ranks_from_env(env) == Ranks(5, 8, 1, 4, "torchrun")


def test_the_batch_shell_and_a_plain_process_are_one_rank() -> None:
    # The batch shell has SLURM_PROCID=0 and SLURM_NTASKS=2 (job 1349) but no step: not a rank of 2.
    batch = {"SLURM_JOB_ID": "1349", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    assert ranks_from_env(batch) == SINGLE and ranks_from_env({}) == SINGLE


@pytest.mark.parametrize(("env", "message"), [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "torchrun says rank 2 of 2"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a whole number"),
    ({**SRUN_TASK_1_OF_4, "SLURM_NTASKS": ""}, "SLURM_NTASKS='' is not a whole number"),
])
def test_nonsense_rank_variables_are_one_line_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        ranks_from_env(env)


def test_threads_come_from_the_allocation_not_a_fixed_one() -> None:
    srun = ranks_from_env(SRUN_TASK_1_OF_4)
    assert cpu_threads(srun, SRUN_TASK_1_OF_4, available=3) == 3  # the task's --cpus-per-task
    assert cpu_threads(srun, SRUN_TASK_1_OF_4, available=2) == 2  # never more than it may run on
    torchrun = Ranks(0, 4, 0, 4, "torchrun")
    assert cpu_threads(torchrun, {}, available=16) == 4  # the host's CPUs shared by its 4 local ranks
    assert cpu_threads(torchrun, {}, available=2) == 1
    assert cpu_threads(SINGLE, {}, available=2) == 2


def test_builder_command_is_srun_in_a_batch_shell_torchrun_elsewhere() -> None:
    from trainers.build_ranks import builder_command

    argv, env = builder_command(["m", "--x"], 4, 23456, {"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "3"})
    assert argv[:4] == ["srun", "--kill-on-bad-exit=1", "--ntasks=4", "--cpus-per-task=3"] and argv[-3:] == ["-m", "m", "--x"]
    assert env["MASTER_PORT"] == "23456" and env["MASTER_ADDR"]
    argv, env = builder_command(["m"], 2, 23456, {})
    assert argv[1:5] == ["-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2"] and argv[-2:] == ["-m", "m"]
    argv, _ = builder_command(["m"], 1, 23456, {})
    assert argv[1:] == ["-m", "m"]


# -- N ranks == 1 rank, bitwise, as processes over gloo ----------------------------------------------

def _hidden_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.glob("*.safetensors"))}


@pytest.mark.slow
def test_two_hidden_ranks_over_gloo_write_the_one_rank_files_bitwise(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    from cache.episodes import Demo, write_episodes
    from ground.paths import expand_path
    from ground.spec import load_spec
    from hidden_quick_spec import use_hidden_quick
    from trainers.build_hidden_cache import build_hidden_cache

    use_hidden_quick(monkeypatch, tmp_path)
    spec = load_spec("quickstart").spec
    rng = np.random.default_rng(0)
    demos = [Demo(f"demo_{i}", rng.standard_normal((steps, 7)).astype(np.float32), rng.standard_normal((steps, 4)),
                  {"robot0_agentview_image": rng.integers(0, 255, (steps, 24, 24, 3), dtype=np.uint8)})
             for i, steps in enumerate((23, 9, 40))]
    write_episodes(expand_path(spec.data.episodes), demos, {"env_name": "Lift"}, {"train": ["demo_0", "demo_1"],
                                                                                  "valid": ["demo_2"]})
    one = build_hidden_cache(spec)
    assert one["built"] == 3
    two_root = tmp_path / "two_ranks"
    spec2 = spec.model_copy(update={"data": spec.data.model_copy(update={"cache_root": str(two_root)})})
    two = build_hidden_cache(spec2, processes=2)
    # demo k → rank k mod 2: demo_0, demo_2 on rank 0; demo_1 on rank 1; each on its own CPU thread.
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert [(r["rank_of_build"], r["built"], r["skipped"], r["device"], r["threads"]) for r in two["per_process"]] == [
        (0, 2, 0, "cpu", threads), (1, 1, 0, "cpu", threads)]
    assert two["built"] == 3
    assert _hidden_files(two_root) == _hidden_files(expand_path(spec.data.cache_root))
    assert len(_hidden_files(two_root)) == 3
    # A rerun with another world size finds every file finished and writes none.
    assert build_hidden_cache(spec2, processes=2)["built"] == 0
