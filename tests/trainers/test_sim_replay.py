"""Real robosuite demos (Panda, OSC, EGL camera) and exact replay in the simulator."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

STEPS = 25


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainers.sim.demos import make_demos

    path = tmp_path_factory.mktemp("sim") / "demos.hdf5"
    summary = make_demos(path, "Lift", 3, seed=0, camera_size=32, horizon=STEPS)
    assert summary["splits"] == {"train": 2, "valid": 1}
    return path


def test_demo_file_has_robomimic_layout_with_frames_and_env_args(demo_file: Path) -> None:
    import json

    with h5py.File(demo_file, "r") as handle:
        env_args = json.loads(handle["data"].attrs["env_args"])
        assert env_args["env_name"] == "Lift"
        assert env_args["env_kwargs"]["controller_configs"]["body_parts"]["right"]["type"] == "OSC_POSE"
        demo = handle["data/demo_0"]
        assert demo["actions"].shape == (STEPS, 7)
        assert demo["obs/agentview_image"].shape == (STEPS, 32, 32, 3)
        assert demo["obs/agentview_image"].dtype == np.uint8
        assert demo["obs/robot0_eef_pos"].shape == (STEPS, 3)
        assert "<mujoco" in demo.attrs["model_file"]
        assert [n.decode() for n in handle["mask/valid"][()]] == ["demo_2"]
        # The arm moves: the scripted policy is not standing still.
        eef = demo["obs/robot0_eef_pos"][()]
        assert np.linalg.norm(eef[-1] - eef[0]) > 0.02


@pytest.mark.slow
def test_replaying_recorded_actions_reproduces_the_eef_track(demo_file: Path) -> None:
    from trainers.sim.replay import replay_episodes

    results = replay_episodes(demo_file, ["demo_0", "demo_1", "demo_2"])
    assert [r.demo for r in results] == ["demo_0", "demo_1", "demo_2"]
    for result in results:
        assert result.eef_mm < 0.1, result


def test_perturbed_actions_give_a_larger_error(demo_file: Path) -> None:
    from cache.episodes import read_demo
    from trainers.sim.replay import replay_episodes

    recorded = read_demo(demo_file, "demo_0").actions
    noisy = recorded + np.random.default_rng(0).normal(0.0, 0.3, recorded.shape)
    exact, = replay_episodes(demo_file, ["demo_0"])
    perturbed, = replay_episodes(demo_file, ["demo_0"], predict=lambda name: noisy)
    assert perturbed.eef_mm > 5.0
    assert perturbed.eef_mm > 100 * max(exact.eef_mm, 0.01)


def test_same_seed_same_demos_other_seed_other_demos() -> None:
    from trainers.sim.demos import collect_demos

    first = collect_demos("Lift", 2, seed=3, camera_size=32, horizon=4)
    again = collect_demos("Lift", 2, seed=3, camera_size=32, horizon=4)
    other = collect_demos("Lift", 2, seed=4, camera_size=32, horizon=4)
    for a, b in zip(first.demos, again.demos):
        assert np.array_equal(a.states, b.states)
        assert np.array_equal(a.actions, b.actions)
        assert np.array_equal(a.obs["agentview_image"], b.obs["agentview_image"])
    assert not np.array_equal(first.demos[0].states[0], other.demos[0].states[0])


def test_tile_chunks_takes_each_window_up_to_the_next() -> None:
    from trainers.sim.evaluate import tile_chunks

    chunks = np.stack([np.full((4, 2), float(i)) for i in range(3)])  # 3 windows, horizon 4
    actions = tile_chunks(chunks, [0, 2, 4], stride=2, steps=7)
    assert actions[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="without an action"):
        tile_chunks(chunks, [0, 2, 4], stride=2, steps=9)


def test_data_demos_cli_writes_a_replayable_file(cli, tmp_path: Path) -> None:
    out = tmp_path / "d.hdf5"
    result = cli("data", "demos", "--n", "2", "--steps", "6", "--camera-size", "32", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "2 Lift demos × 6 steps" in result.output
    assert "splits train 1, valid 1" in result.output
    from trainers.sim.replay import replay_episodes

    assert replay_episodes(out, ["demo_1"])[0].eef_mm < 0.1


@pytest.mark.parametrize(("args", "message"), [
    (["--n", "1"], "error: --n: --n 1 leaves no held-out demo"),
    (["--camera-size", "84"], "error: --camera-size: camera size 84 px is not a positive multiple of 16"),
    (["--env", "Stack"], "error: --env: no scripted policy for env 'Stack'"),
    (["--steps", "1"], "error: --steps: --steps 1 is too short"),
])
def test_data_demos_bad_input_is_one_line_exit_2_nothing_written(cli, tmp_path: Path, args: list[str],
                                                                  message: str) -> None:
    out = tmp_path / "d.hdf5"
    result = cli("data", "demos", "--out", str(out), *args)
    assert result.exit_code == 2
    assert result.output.startswith(message)
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()
