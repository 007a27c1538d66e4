"""The worked external repository (examples/team_repo) replays card A's jobs 6262 and 6321 standalone.

Each test runs the team's real launch script as a subprocess on the tiny cache, through the entry
contract alone (``spec.json`` in ``IDMCTL_RUN_DIR``, ``IDMCTL_SMOKE_*``, ``IDMCTL_STEP`` lines, exit 75),
without idmctl's class-path and smoke machinery: the repository itself must behave as the card says.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ground.contract import (CHECKPOINT_MARKER, ENV_RUN_DIR, ENV_SMOKE_BATCH, ENV_SMOKE_STEPS, EXIT_REQUEUE,
                             SPEC_FILE, STEP_MARKER)
from trainers.tiny_data import tiny_spec

REPO = Path(__file__).resolve().parents[2]
TEAM = REPO / "examples" / "team_repo"
SCRIPT = Path("scripts") / "run_idm_train_robocasa_latent_C_layer_routed_n4.sh"
DEADLINE_S = 240
"""Per subprocess: a torch import plus a few tiny steps take seconds; two shared cores can make it a minute."""
STEP_LINE = re.compile(rf"^{STEP_MARKER} step=(\d+) loss=(\S+) seconds=")


def team_spec(tiny_cache, selected: list[int] | None) -> dict:
    """tiny_spec's typed sections, with the team's dataset and model named by class path."""
    spec = tiny_spec(tiny_cache.data)
    data = tiny_cache.data
    init_args = {"episodes": data["episodes"], "cache_root": data["cache_root"], "frame_window": 2,
                 "action_horizon": 4}
    if selected is not None:
        init_args["selected_layer_indices"] = selected
    routed = len(selected) if selected is not None else len(data["cached_layers"])
    spec["data"]["dataset"] = {"class_path": "team_idm.data.RobocasaLatentIDMDatasetHiddenMultiLayer",
                               "init_args": init_args}
    spec["model"]["name"] = {"class_path": "team_idm.model.TinyIDM",
                             "init_args": {"num_layers": routed, "channels": data["channels"],
                                           "action_dim": data["action_dim"], "action_horizon": 4, "hidden_dim": 32}}
    spec["code"] = {"roots": ["examples/team_repo"], "entry": f"bash examples/team_repo/{SCRIPT}"}
    return spec


def run_dir_with(path: Path, spec: dict) -> Path:
    path.mkdir(parents=True)
    (path / SPEC_FILE).write_text(json.dumps({"name": "team_n4", "hash": "0" * 16, "spec": spec}))
    return path


def fixed_copy(tmp_path: Path) -> Path:
    """The repository with the card's two fixes applied, as the team committed them."""
    root = tmp_path / "team_repo_fixed"
    shutil.copytree(TEAM, root, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    shutil.copy(root / "fixes" / "data_fixed.py", root / "team_idm" / "data.py")
    shutil.copy(root / "fixes" / "train_fixed.py", root / "team_idm" / "train.py")
    return root


def entry_env(team_root: Path, run_dir: Path, python: str = sys.executable, smoke: bool = False,
              **extra: str) -> dict[str, str]:
    # No IDMCTL_HOME: outside a job there is no chain MLflow run for the Reporter to log to.
    env = {key: value for key, value in os.environ.items() if not key.startswith("IDMCTL_")}
    env.update({ENV_RUN_DIR: str(run_dir), "IDMCTL_PYTHON": python, "PYTHONPATH": f"{team_root}:{REPO}",
                "PYTHONDONTWRITEBYTECODE": "1", **extra})
    if smoke:
        env.update({ENV_SMOKE_STEPS: "2", ENV_SMOKE_BATCH: "2"})
    return env


def launch(team_root: Path, env: dict[str, str], *args: str, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["bash", str(team_root / SCRIPT), *args], env=env, capture_output=True, text=True,
                              timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not exit within {DEADLINE_S} s")


def steps_of(stdout: str) -> list[tuple[int, float]]:
    return [(int(m.group(1)), float(m.group(2))) for m in map(STEP_LINE.match, stdout.splitlines()) if m]


def test_the_shipped_trainer_dies_on_persistent_workers_with_zero_workers(tiny_cache, tmp_path: Path) -> None:
    """Job 6262: persistent_workers=True hard-coded while the launch script passes num_workers 0."""
    # The N=12-era spec (no layer selection yet), so the dataset builds and the DataLoader is reached.
    run_dir = run_dir_with(tmp_path / "run", team_spec(tiny_cache, selected=None))
    done = launch(TEAM, entry_env(TEAM, run_dir, smoke=True), what="the shipped repo's smoke")
    assert done.returncode != 0
    assert "ValueError: persistent_workers option needs num_workers > 0" in done.stderr, done.stderr[-3000:]
    assert steps_of(done.stdout) == []


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_selected_layer_indices_went_to_the_wrong_class(tiny_cache) -> None:
    """Job 6321: the parameter was added to HiddenRaw (earlier in the file), not HiddenMultiLayer, which runs."""
    shipped = _load(TEAM / "team_idm" / "data.py", "team_data_shipped")
    raw, multi = shipped.RobocasaLatentIDMDatasetHiddenRaw, shipped.RobocasaLatentIDMDatasetHiddenMultiLayer
    paths = {"episodes": tiny_cache.data["episodes"], "cache_root": tiny_cache.data["cache_root"]}
    with pytest.raises(TypeError, match="unexpected keyword argument 'selected_layer_indices'"):
        multi(**paths, split="train", selected_layer_indices=[0, 2])
    sample = raw(**paths, split="train", selected_layer_indices=[0, 2])[1]
    assert tuple(sample["hidden"].shape) == (2, 2, 2, 2 * 16)  # (T_w, H, W, N*C)
    assert raw.__init__.__code__.co_firstlineno < multi.__init__.__code__.co_firstlineno

    # The fixed class reads the same bytes idmctl's own reader does, and the actions after the window.
    from cache.episodes import read_demo
    from cache.hidden import read_hidden

    fixed = _load(TEAM / "fixes" / "data_fixed.py", "team_data_fixed").RobocasaLatentIDMDatasetHiddenMultiLayer
    sample = fixed(**paths, split="train", selected_layer_indices=[0, 2])[1]  # demo_0, frames 1..2
    expected = read_hidden(Path(tiny_cache.data["cache_root"]) / "demo_0.safetensors", [0, 2], 1, 2)
    assert torch.equal(sample["hidden"], expected.float())
    actions = read_demo(tiny_cache.data["episodes"], "demo_0").actions
    assert torch.equal(sample["actions"], torch.from_numpy(actions[2:6]))  # frame 1 = timestep 1 x stride 2


def test_the_fixed_repo_passes_the_smoke_in_exactly_the_steps_asked(tiny_cache, tmp_path: Path) -> None:
    root = fixed_copy(tmp_path)
    run_dir = run_dir_with(tmp_path / "run", team_spec(tiny_cache, selected=[0, 2]))
    done = launch(root, entry_env(root, run_dir, smoke=True), what="the fixed repo's smoke")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(done.stdout)
    assert [step for step, _ in steps] == [1, 2], done.stdout
    assert all(math.isfinite(loss) for _, loss in steps)
    assert sum(line.startswith(STEP_MARKER) for line in done.stdout.splitlines()) == 2
    assert any(line.startswith(f"{CHECKPOINT_MARKER} seconds=") for line in done.stdout.splitlines())


# Stands in for the venv python in the launch script (IDMCTL_PYTHON). A 6-step CPU run ends in
# milliseconds, so a signal sent "after step 2" could land after the run is over: this holds the
# trainer inside its step-2 line until the test has sent SIGUSR1, so the notice always arrives mid-run.
GATED_PYTHON = '''#!{python}
import os, runpy, sys

class Gate:
    def __init__(self, stream):
        self.stream, self.line = stream, ""
    def write(self, text):
        written = self.stream.write(text)
        self.line += text
        while "\\n" in self.line:
            line, _, self.line = self.line.partition("\\n")
            if line.startswith("{marker} step=2 "):
                self.stream.flush()
                os.read(int(os.environ["TEAM_TEST_GATE_FD"]), 1)
        return written
    def __getattr__(self, name):
        return getattr(self.stream, name)

assert sys.argv[1] == "-m", sys.argv
sys.stdout = Gate(sys.stdout)
sys.argv = sys.argv[2:]
sys.path.insert(0, os.getcwd())  # what `python -m` puts first
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
'''


def _interrupt_after_step_2(root: Path, run_dir: Path, tmp_path: Path) -> tuple[int, str]:
    gated = tmp_path / "gated_python"
    gated.write_text(GATED_PYTHON.format(python=sys.executable, marker=STEP_MARKER))
    gated.chmod(0o755)
    gate_read, gate_write = os.pipe()
    stderr = open(tmp_path / "interrupted.stderr", "w+")
    process = subprocess.Popen(["bash", str(root / SCRIPT), "--max_steps", "6", "--save_steps", "2"],
                               env=entry_env(root, run_dir, python=str(gated), TEAM_TEST_GATE_FD=str(gate_read)),
                               pass_fds=(gate_read,), stdout=subprocess.PIPE, stderr=stderr, text=True)
    os.close(gate_read)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put(None)], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not seen or not seen[-1].startswith(f"{STEP_MARKER} step=2 "):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no '{STEP_MARKER} step=2' line within {DEADLINE_S} s; stdout so far: {seen}")
            if line is None:
                stderr.seek(0)
                pytest.fail(f"the trainer ended before its step-2 line: {seen}\n{stderr.read()[-3000:]}")
            seen.append(line)
        process.send_signal(signal.SIGUSR1)
        os.write(gate_write, b"g")
        try:
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the trainer did not exit within {DEADLINE_S} s of start after SIGUSR1")
    finally:
        os.close(gate_write)
        if process.poll() is None:
            process.kill()
            process.wait()
    try:
        while (line := lines.get(timeout=DEADLINE_S)) is not None:  # the reader thread ends at EOF
            seen.append(line)
    except queue.Empty:
        pytest.fail(f"the trainer's stdout did not close within {DEADLINE_S} s of its exit")
    stderr.seek(0)
    return code, "".join(seen) + stderr.read()


@pytest.mark.slow
def test_a_preempted_run_checkpoints_exits_75_and_resumes_where_it_stopped(tiny_cache, tmp_path: Path) -> None:
    root = fixed_copy(tmp_path)
    spec = team_spec(tiny_cache, selected=[0, 2])
    straight = run_dir_with(tmp_path / "straight", spec)
    done = launch(root, entry_env(root, straight), "--max_steps", "6", "--save_steps", "2",
                  what="the uninterrupted 6-step run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [step for step, _ in steps_of(done.stdout)] == [1, 2, 3, 4, 5, 6]

    interrupted = run_dir_with(tmp_path / "interrupted", spec)
    code, output = _interrupt_after_step_2(root, interrupted, tmp_path)
    assert code == EXIT_REQUEUE, output[-3000:]
    assert "stop signal received (SIGUSR1): checkpoint-2 written" in output
    assert sorted(p.name for p in interrupted.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]
    assert not [p for p in interrupted.iterdir() if ".tmp" in p.name]

    resumed = launch(root, entry_env(root, interrupted), "--max_steps", "6", "--save_steps", "2",
                     what="the resumed run")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from checkpoint-2 at step 2" in resumed.stdout
    steps = steps_of(resumed.stdout)
    assert steps[0][0] > 2 and steps[-1][0] == 6, resumed.stdout
    assert [step for step, _ in steps] == [3, 4, 5, 6]
    # Resume is exact: same batches, weights and optimizer state as the run that was never stopped.
    weights = [torch.load(run / "checkpoint-6" / "model.pt", weights_only=True) for run in (straight, interrupted)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
