"""The agentview camera never yields noise: many frames under a CPU hog on every core, with the
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


@pytest.fixture
def cpu_hog() -> Iterator[subprocess.Popen]:
    """scripts/cpu_hog.sh keeping every core busy for the duration of the test. It runs in its own
    process group, which teardown kills whatever happened, so a failed start never leaves busy loops
    behind to slow the rest of the suite."""
    import signal

    hog = subprocess.Popen([str(REPO / "scripts" / "cpu_hog.sh"), "--", "sleep", "600"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_busy_children(hog.pid)) < (os.cpu_count() or 1):
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
    try:
        for episode in range(2):
            env.reset()  # a hard reset: a new model and sim; the previous ones become garbage
            recorded: list[tuple[np.ndarray, np.ndarray]] = []
            with Camera(env.sim, SIZE) as camera:
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
        env.close()
    assert cpu_hog.poll() is None, "the hog stopped before the frames were rendered"
    assert frames == 2 * STEPS


def test_a_frame_with_nothing_drawn_or_with_noise_raises_and_is_not_retried() -> None:
    from trainers.sim.env import Camera, RenderError, make_env

    class Stub:
        def __init__(self, picture: np.ndarray | None) -> None:
            self.picture, self.calls = picture, 0

        def update_scene(self, *args: object, **kwargs: object) -> None:
            pass

        def render(self, out: np.ndarray) -> np.ndarray:
            self.calls += 1
            if self.picture is not None:
                out[:] = self.picture
            return out

        def close(self) -> None:
            pass

    env = make_env("Lift", seed=0)
    try:
        with Camera(env.sim, SIZE) as camera:
            real = camera._renderer
            noise = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
            for picture, message in ((None, "drew nothing"), (noise, "rendered noise")):
                camera._renderer = stub = Stub(picture)
                with pytest.raises(RenderError, match=message):
                    camera.frame()
                assert stub.calls == 1
            camera._renderer = real
            assert camera.frame().any()
        with pytest.raises(RenderError, match="closed"):
            camera.frame()
    finally:
        env.close()


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
