"""The agentview camera never yields noise: many frames under a CPU hog, with the
garbage collector run between frames, hard resets, and a second camera opened and closed meanwhile
(the conditions that broke robosuite's own renderer: see bench/render_noise.py)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SIZE = 64
STEPS = 12
HOG_LOOPS = 1


@pytest.fixture
def cpu_hog() -> Iterator[subprocess.Popen]:
    """scripts/cpu_hog.sh with one busy loop for the duration of the test: with the test's own rendering, both
    cores of a 2-core machine are busy, so the renderer is preempted mid-frame as under a loaded node (a loop
    per core burned ~14 s of the suite's CPU in this one test, while the other test workers load the machine
    anyway). It runs in its own process group, which teardown kills whatever happened, so a failed start
    never leaves busy loops behind to slow the rest of the suite."""
    import signal

    hog = subprocess.Popen([str(REPO / "scripts" / "cpu_hog.sh"), "-n", str(HOG_LOOPS), "--", "sleep", "600"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_busy_children(hog.pid)) < HOG_LOOPS:
            assert hog.poll() is None, f"scripts/cpu_hog.sh exited {hog.returncode} before its busy loops started"
            assert time.monotonic() < deadline, "timed out after 60 s waiting for scripts/cpu_hog.sh's busy loops"
            time.sleep(0.05)
        loops = _busy_children(hog.pid)
        yield hog
        hog.terminate()  # the script's own clean-up (its EXIT trap stops the loops) is what is tested here
        hog.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in loops):
            assert time.monotonic() < deadline, f"busy loops {loops} outlived scripts/cpu_hog.sh"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(hog.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        hog.wait(timeout=30)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _busy_children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    if not path.exists():
        return []
    busy = []
    for child in path.read_text().split():
        try:
            comm = Path(f"/proc/{child}/comm").read_text().strip()
        except OSError:  # gone meanwhile
            continue
        if comm != "sleep":  # the busy loops are forks of the script; `sleep` is the wrapped command
            busy.append(int(child))
    return busy


@pytest.mark.slow
def test_frames_under_load_resets_and_collections_are_never_noise_and_are_functions_of_the_state(cpu_hog) -> None:
    from trainers.sim.env import Camera, frame_gradient, is_noise, make_env

    env = make_env("Lift", seed=0)
    rng = np.random.default_rng(0)
    frames = 0
    camera = Camera(env.sim, SIZE)
    try:
        for episode in range(2):
            env.reset()  # a hard reset: a new model and sim; the previous ones become garbage
            camera.follow(env.sim)  # the demos' loop: one camera follows every hard reset
            recorded: list[tuple[np.ndarray, np.ndarray]] = []
            for step in range(STEPS):
                env.step(rng.uniform(-1, 1, 7))
                if step % 4 == 1:
                    gc.collect()  # the collector running at any point frees nothing of ours
                if step == 5 and episode == 0:  # another camera in this thread, opened and closed mid-episode
                    with Camera(env.sim, SIZE, fast=False) as second:
                        assert not is_noise(second.frame())
                frame = camera.frame()
                assert frame.shape == (SIZE, SIZE, 3) and frame.dtype == np.uint8
                assert frame.any() and not is_noise(frame), f"episode {episode} step {step}: {frame_gradient(frame)}"
                recorded.append((np.array(env.sim.get_state().flatten()), frame))
                frames += 1
            # A frame nothing was drawn into can hold a stale copy of an earlier one, which no noise
            # detector sees: each frame must equal a render of the state it was recorded with.
            for state, frame in recorded[::-3]:
                env.sim.set_state_from_flattened(state)
                assert np.array_equal(camera.frame(), frame)
    finally:
        camera.close()
        env.close()
    assert cpu_hog.poll() is None, "the hog stopped before the frames were rendered"
    assert frames == 2 * STEPS


def test_a_frame_with_nothing_drawn_or_with_noise_raises_and_is_not_retried() -> None:
    from trainers.sim.env import Camera, RenderError, make_env

    env = make_env("Lift", seed=0)
    try:
        with Camera(env.sim, SIZE) as camera:
            noise = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
            blank = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
            for picture, message in ((blank, "drew nothing"), (noise, "rendered noise")):
                calls = []
                camera._render = lambda picture=picture: calls.append(1) or picture  # what GL handed back
                with pytest.raises(RenderError, match=message):
                    camera.frame()
                assert len(calls) == 1
            del camera._render  # the class's own again
            assert camera.frame().any()
        with pytest.raises(RenderError, match="closed"):
            camera.frame()
    finally:
        env.close()


def test_a_camera_that_follows_hard_resets_keeps_its_context_and_draws_what_a_new_one_draws() -> None:
    """Lift's hard reset builds a new model whose cube has another size: the meshes and textures are the
    same, so the followed camera keeps its render context, and every frame is bitwise the frame of a
    camera opened on the new model."""
    from trainers.sim.env import Camera, make_env

    env = make_env("Lift", seed=0)
    try:
        with Camera(env.sim, SIZE) as camera:
            sizes = set()
            for _ in range(3):
                env.reset()
                camera.follow(env.sim)
                model = env.sim.model._model
                sizes.add(tuple(model.geom_size[model.geom("cube_g0").id]))
                with Camera(env.sim, SIZE) as fresh:
                    for _ in range(2):
                        env.step(np.zeros(7))
                        assert np.array_equal(camera.frame(), fresh.frame())
            assert camera.contexts_made == 1
            assert len(sizes) == 3, f"the cube's size did not change across hard resets: {sizes}"
    finally:
        env.close()


def test_a_model_with_other_meshes_gets_a_new_context_and_its_own_picture() -> None:
    """The digest tells a moved mesh vertex from a resized box: the first rebuilds the context, the second
    keeps it; each followed frame equals a fresh camera's frame of the same model. (Group 1: the camera
    draws visual geoms only, as robosuite's does.)"""
    from trainers.sim.env import Camera, prepare_robosuite

    prepare_robosuite()  # MuJoCo picks its GL platform (EGL here) when first imported
    import mujoco

    def sim(box: float, vertex: float) -> object:
        xml = f"""<mujoco><asset><mesh name="m" vertex="0 0 0  {vertex} 0 0  0 .1 0  0 0 .1"/></asset>
        <worldbody><light pos="0 0 2"/><camera name="agentview" pos="0 -.6 .3" xyaxes="1 0 0 0 .5 1"/>
        <geom type="plane" size="1 1 .01" rgba=".3 .5 .3 1" group="1"/>
        <geom type="box" size="{box} {box} {box}" pos="-.15 0 .1" rgba=".8 .2 .2 1" group="1"/>
        <geom type="mesh" mesh="m" pos=".1 0 .05" rgba=".2 .2 .8 1" group="1"/></worldbody></mujoco>"""
        model = mujoco.MjModel.from_xml_string(xml)
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        # the two attributes Camera reads from a robosuite sim
        return type("Sim", (), {"model": type("M", (), {"_model": model}), "data": type("D", (), {"_data": data})})

    first, resized, other_mesh = sim(0.05, 0.1), sim(0.07, 0.1), sim(0.05, 0.25)
    with Camera(first, SIZE) as camera:
        before = camera.frame()
        camera.follow(resized)
        assert camera.contexts_made == 1
        with Camera(resized, SIZE) as fresh:
            assert np.array_equal(camera.frame(), fresh.frame())
        assert not np.array_equal(camera.frame(), before)
        camera.follow(other_mesh)
        assert camera.contexts_made == 2
        with Camera(other_mesh, SIZE) as fresh:
            assert np.array_equal(camera.frame(), fresh.frame())


def test_robosuite_prints_nothing_when_an_env_is_built() -> None:
    """Its import-time warnings (no private macro file, no robosuite_models, no mink IK) are filtered at the
    source: the logger's filter goes on before robosuite is imported; errors still get through."""
    code = ("import logging; from trainers.sim.env import make_env; make_env('Lift', seed=0).close(); "
            "logging.getLogger('robosuite_logs').error('an error still shows')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "an error still shows" in lines[0], done.stderr
