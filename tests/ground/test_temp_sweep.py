"""A writer SIGKILLed mid-write leaves a hidden ``.<name>.tmp<pid>``; the rerun sweeps it.

Each test kills a real writer process inside its fsync (after the bytes, before the rename), then reruns
the same writer and checks that no temp file is left and the file under its final name reads back.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cache.episodes import Demo, EpisodeFile, write_episodes
from fork_support import run_forked, sigkill_at_fsync_of
from ground.paths import REPO_ROOT, expand_path, sweep_dead_temp_files, temp_files

KILL_IN_FSYNC_OF = """
import os, signal, sys
marker = sys.argv[1]
real_fsync = os.fsync
def fsync(fd):
    if marker in os.readlink(f"/proc/self/fd/{fd}"):
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync(fd)
os.fsync = fsync
sys.argv = sys.argv[2:]
"""


def _killed(marker: str, body: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([sys.executable, "-c", KILL_IN_FSYNC_OF + body, marker], cwd=REPO_ROOT,
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == -9, result.stderr[-2000:]


def _demos() -> list[Demo]:
    rng = np.random.default_rng(0)
    return [Demo(f"demo_{i}", rng.standard_normal((6, 7)).astype(np.float32), rng.standard_normal((6, 4)),
                 {"robot0_eef_pos": rng.standard_normal((6, 3))}) for i in range(2)]


WRITE_DEMOS = """
import numpy as np
from pathlib import Path
from cache.episodes import Demo, write_episodes
rng = np.random.default_rng(0)
demos = [Demo(f"demo_{i}", rng.standard_normal((6, 7)).astype(np.float32), rng.standard_normal((6, 4)),
              {"robot0_eef_pos": rng.standard_normal((6, 3))}) for i in range(2)]
write_episodes(Path(sys.argv[0]), demos, {"env_name": "Lift"}, {"train": ["demo_0"], "valid": ["demo_1"]})
"""


def test_a_killed_demo_write_is_swept_by_the_rerun(tmp_path: Path) -> None:
    out = tmp_path / "demos.hdf5"
    body = WRITE_DEMOS.replace("sys.argv[0]", repr(str(out)))
    _killed(".demos.hdf5.tmp", body)
    assert not out.exists() and len(temp_files(tmp_path, "demos.hdf5")) == 1
    write_episodes(out, _demos(), {"env_name": "Lift"}, {"train": ["demo_0"], "valid": ["demo_1"]})
    assert temp_files(tmp_path) == []
    assert EpisodeFile(out).demos("all") == ["demo_0", "demo_1"]


def test_a_live_writers_temp_file_is_left_alone(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".demos.hdf5.tmp{sleeper.pid}"
        dead = tmp_path / ".demos.hdf5.tmp999999999"
        live.write_bytes(b"being written")
        dead.write_bytes(b"half")
        assert sweep_dead_temp_files(tmp_path) == 1
        assert live.exists() and not dead.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow
def test_a_killed_hidden_cache_build_is_swept_by_the_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hidden_quick_spec import use_hidden_quick

    from ground.spec import load_spec
    from trainers.build_hidden_cache import build_hidden_cache
    from trainers.cosmos_encode import load_models

    use_hidden_quick(monkeypatch, tmp_path)
    spec = load_spec("quickstart").spec
    write_episodes(expand_path(spec.data.episodes), [Demo(d.name, d.actions, d.states, {
        **d.obs, "robot0_agentview_image": np.zeros((6, 24, 24, 3), dtype=np.uint8)}) for d in _demos()],
        {"env_name": "Lift"}, {"train": ["demo_0"], "valid": ["demo_1"]})
    root = expand_path(spec.data.cache_root)

    def killed_in_the_fsync_of_demo_1() -> None:
        sigkill_at_fsync_of(".demo_1.safetensors.tmp")
        build_hidden_cache(load_spec("quickstart").spec)

    # The builder in a child forked from this process: the same real process and SIGKILL as a fresh
    # `python -c`, without its ~10 s of CPU importing torch and diffusers again. Loading the models here
    # first imports diffusers in this process, which the rebuild below needs anyway.
    load_models(spec.data)
    assert run_forked(killed_in_the_fsync_of_demo_1, "the hidden builder killed in demo_1's fsync") == -9
    assert [p.name.split(".tmp")[0] for p in temp_files(root)] == [".demo_1.safetensors"]
    summary = build_hidden_cache(spec)
    assert (summary["built"], summary["skipped"]) == (1, 1)
    assert temp_files(root) == []
    # A file whose header lacks `layers` (a KeyError in `cache inspect` before) is rebuilt, as the runbook says.
    import json
    import struct

    from cache.hidden import FORMAT_TAG, cache_file, inspect_file

    broken = json.dumps({"__metadata__": {"format": json.dumps(FORMAT_TAG)}}).encode()
    cache_file(root, "demo_0", "safetensors").write_bytes(struct.pack("<Q", len(broken)) + broken)
    assert build_hidden_cache(spec)["built"] == 1
    assert inspect_file(cache_file(root, "demo_0", "safetensors")).layers == list(spec.data.cached_layers)


@pytest.mark.slow
def test_a_trainer_killed_in_its_preemption_checkpoint_leaves_nothing_after_the_rerun(tiny_cache, tmp_path: Path) -> None:
    """The preemption notice (USR1) makes the trainer checkpoint at whatever step it is on; Slurm's kill at
    the end of GraceTime can land inside that write. The rerun never saves that step again, so only a
    sweep removes its temp file."""
    import signal

    from test_train import prepare_run, run_trainer, trainer_env

    from trainers.checkpoint import checkpoint_dir, complete_checkpoints

    run_dir = prepare_run(tiny_cache, tmp_path, "killed", train={"steps": 12, "checkpoint_every": 100, "log_every": 1})
    body = (f"import runpy; sys.argv = ['trainers.train', '--run-dir', {str(run_dir)!r}]\n"
            "runpy.run_module('trainers.train', run_name='__main__')\n")
    process = subprocess.Popen([sys.executable, "-c", KILL_IN_FSYNC_OF + body, ".ckpt.tmp"], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=trainer_env(IDMCTL_ATTEMPT="1"))
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("step 3/"):
            process.send_signal(signal.SIGUSR1)
            break
    process.stdout.read()
    assert process.wait(timeout=300) == -9
    [leftover] = temp_files(checkpoint_dir(run_dir))
    assert complete_checkpoints(run_dir) == []
    rerun = run_trainer(run_dir, IDMCTL_ATTEMPT="2")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert temp_files(checkpoint_dir(run_dir)) == [] and temp_files(run_dir) == [], leftover
    assert complete_checkpoints(run_dir)[-1][0] == 12
