"""How an entry launches: once per rank under srun, once per node when it starts its own
ranks (torchrun, accelerate, deepspeed), or one process; and srun gets the CPUs per task itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ground.contract import ENV_NNODES, ENV_NPROC_PER_NODE
from ground.spec.schema import detect_launch
from idmctl.core.job_options import JobRequest
from idmctl.job.effective import build

REPO = Path(__file__).resolve().parents[3]
TEAM = REPO / "examples" / "team_repo" / "experiments"


@pytest.mark.parametrize(("entry", "mode"), [
    ("torchrun --nproc_per_node 8 train.py", "per_node"),
    ("/opt/venv/bin/torchrun --nnodes 2 train.py", "per_node"),
    ("OMP_NUM_THREADS=8 torchrun train.py", "per_node"),
    ("python -m torch.distributed.run --nproc_per_node 8 train.py", "per_node"),
    ("python3.11 -m torch.distributed.launch train.py", "per_node"),
    ("accelerate launch --config_file configs_acc/4gpu.yaml scripts/build.py", "per_node"),  # card B's builder
    ("deepspeed train.py", "per_node"),
    ("accelerate config", None),
    ("python -m team_idm.train", None),
    ("bash scripts/run.sh", None),  # the command line does not show what the script starts
    ("team_idm.train", None),
])
def test_the_launch_is_read_from_the_command_line_where_it_shows(entry: str, mode: str | None) -> None:
    assert detect_launch(entry) == mode


def _spec(tmp_path: Path, **sections: object) -> Path:
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump({"extends": "quickstart", **sections}))
    return path


def _one_line_exit_2(result, starts: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), result.stderr
    assert "Traceback" not in result.output


def test_a_stated_launch_the_command_line_contradicts_is_a_spec_error(cli, tmp_path: Path, idmctl_home: Path) -> None:
    spec = _spec(tmp_path, code={"entry": "torchrun --nproc_per_node 2 train.py", "launch": "per_rank"})
    result = cli("submit", str(spec), "--dry-run")
    _one_line_exit_2(result, f"error: {spec}:code.launch: launch 'per_rank' contradicts the entry "
                             "'torchrun --nproc_per_node 2 train.py', which starts its own ranks (per_node)")
    assert not (idmctl_home / "runs").exists()


def test_an_entry_flag_the_stated_launch_contradicts_names_the_flag(cli, tmp_path: Path) -> None:
    spec = _spec(tmp_path, code={"launch": "single"})
    result = cli("submit", str(spec), "--dry-run", "--entry", "torchrun --nproc_per_node 2 train.py")
    _one_line_exit_2(result, "error: command line:--entry: 'torchrun --nproc_per_node 2 train.py' starts its own "
                             "ranks (per_node), but code.launch is single")


def test_a_launch_script_that_starts_its_own_ranks_must_say_so(cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Card A's `bash run.sh` shape: the command line shows bash, the script shows torchrun. Unstated, it would
    run under one srun task per rank: 8 launchers × 8 ranks."""
    monkeypatch.setenv("IDMCTL_TEAM_DATA", str(tmp_path))
    data = yaml.safe_load((TEAM / "team_torchrun_8gpu.yaml").read_text())
    del data["code"]["launch"]
    # Outside the repository: a file written into the tree races every snapshot another test takes.
    data["extends"] = str(TEAM / "team_n4.yaml")
    spec = tmp_path / "probe.yaml"
    spec.write_text(yaml.safe_dump(data))
    result = cli("submit", str(spec), "--dry-run", "--cluster", "card")
    _one_line_exit_2(result, f"error: {spec}:code.launch: run_idm_train_torchrun.sh:9 starts its own ranks "
                             "(-m torch.distributed.run); under one srun task per rank")
    assert "state code.launch: per_node" in result.stderr


def test_per_node_runs_once_per_node_with_the_node_and_tells_the_script_its_ranks(monkeypatch, tmp_path: Path) -> None:
    from idmctl.job.render import _sbatch_lines

    monkeypatch.setenv("IDMCTL_TEAM_DATA", str(tmp_path))
    job = build(str(TEAM / "team_torchrun_8gpu.yaml"), JobRequest(), "card")
    options = job.options
    assert (options.launch, options.ranks_per_node, options.tasks_per_node, options.cpus_per_task) == ("per_node", 8, 1, 112)
    header = _sbatch_lines(options, "/tmp/x-%j.out")
    assert "#SBATCH --ntasks-per-node=1" in header and "#SBATCH --cpus-per-task=112" in header
    assert "#SBATCH --gres=gpu:8" in header
    # The launch line and the exports (IDMCTL_NPROC_PER_NODE=8) are in the golden file team_torchrun_per_node.sh.


def test_single_runs_one_process_on_one_node(cli, tmp_path: Path) -> None:
    spec = _spec(tmp_path, code={"launch": "single"}, resources={"nodes": 2})
    _one_line_exit_2(cli("submit", str(spec), "--dry-run"),
                     f"error: {spec}:code.launch: launch single runs one process, on one node; resources.nodes is 2")
    one = _spec(tmp_path, code={"launch": "single"}, resources={"cpu_ranks": 2, "cpus": 2})
    result = cli("submit", str(one), "--dry-run", "--cluster", "local-slurm")
    assert result.exit_code == 0, result.output
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=2\n" in result.stdout
    assert "LAUNCH=(srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=2)" in result.stdout


def test_per_rank_srun_gets_the_cpus_per_task_and_the_script_exports_them(cli, tmp_path: Path) -> None:
    """Since Slurm 22.05 srun does not inherit --cpus-per-task from sbatch (nor read SLURM_CPUS_PER_TASK)."""
    spec = _spec(tmp_path, resources={"cpu_ranks": 2, "cpus": 2})
    result = cli("submit", str(spec), "--dry-run", "--cluster", "local-slurm")
    assert result.exit_code == 0, result.output
    assert "#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n" in result.stdout
    assert "LAUNCH=(srun --kill-on-bad-exit=1 --ntasks-per-node=2 --cpus-per-task=1)" in result.stdout
    assert "\nexport SRUN_CPUS_PER_TASK=1\n" in result.stdout
    assert ENV_NPROC_PER_NODE not in result.stdout  # only an entry that starts its own ranks is told


def test_the_smoke_starts_a_per_node_entry_as_the_job_does_with_one_rank(monkeypatch, tmp_path: Path) -> None:
    """The entry smoke runs the team's torchrun script itself (gate/entry_smoke.py), told to start one rank on
    one node: the smoke's one device. An entry srun starts per rank is told nothing."""
    from ground.spec.loader import load_spec
    from idmctl.gate.entry_smoke import _launch_env

    monkeypatch.setenv("IDMCTL_TEAM_DATA", str(tmp_path))
    torchrun = load_spec(str(TEAM / "team_torchrun_8gpu.yaml"))
    assert _launch_env(torchrun, torchrun.spec.code.entry) == {ENV_NPROC_PER_NODE: "1", ENV_NNODES: "1"}
    per_rank = load_spec(str(TEAM / "team_n4.yaml"))
    assert _launch_env(per_rank, per_rank.spec.code.entry) == {}
    assert _launch_env(per_rank, "torchrun --nproc_per_node 8 train.py") == {ENV_NPROC_PER_NODE: "1",
                                                                              ENV_NNODES: "1"}
