"""Why the agentview camera rendered noise: each candidate cause, tested (``python -m bench.render_noise``).

The quickstart once failed with "the agentview camera renders noise twice in a row" (MUJOCO_GL=egl,
Mesa llvmpipe). Each experiment below renders with robosuite's own offscreen renderer (what the
demos used then) and counts bad frames; the last two run the same scenarios through
:class:`trainers.sim.env.Camera` (what the demos use now). A frame is bad when it is noise by
``trainers.sim.env.is_noise`` or when the renderer wrote nothing into a pre-filled buffer (both
kinds appear: the buffer is ``np.empty``, so "nothing drawn" shows up as noise or as a stale copy
of an earlier frame, which no noise detector can see).

Findings on Debian 12, Mesa 22.3.6 llvmpipe, MuJoCo 3.9.0, robosuite 1.5.2, 2 cores:

==============================================  ===========================================
candidate                                       result
==============================================  ===========================================
first EGL context, fresh process, empty Mesa    0 bad frames (3 processes, 5 frames each)
shader cache
concurrent load (busy loops on every core)      0 bad of 200 frames
reading pixels before the render finishes       identical bytes with and without glFinish
                                                (200 frames): glReadPixels waits
a context shared across environments            every frame bad after the other env closes
the garbage collector frees a hard reset's      every frame bad after ``gc.collect()`` until
previous sim (the cause)                        the next reset
==============================================  ===========================================

The cause: robosuite's ``MjRenderContext`` never makes its GL context current before drawing, and
its ``__del__`` frees its MuJoCo GL objects (framebuffer, renderbuffers, textures: small integer
names, the same in every context) in whatever context is current, then calls ``eglReleaseThread``.
A hard ``env.reset()`` replaces the sim without freeing the old one (robosuite frees it only when
its on-screen renderer is "mujoco"); the old sim and its render context reference each other, so
only the cyclic garbage collector frees them, at an allocation count rather than at a point in the
program. When it does, it deletes the current env's framebuffer and leaves no context current:
every frame until the next reset is garbage, so rendering again cannot help. Load only changes
when the collector runs. EGL on Mesa is reliable once each renderer owns its context
(``trainers.sim.env.Camera``, like ``mujoco.Renderer``, makes it current for every frame and is closed
explicitly), so the project
stays on EGL rather than OSMesa.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SIZE = 64


def _robosuite_env(seed: int) -> Any:
    """A Lift env with robosuite's own offscreen renderer: the old demo path."""
    from trainers.sim.env import CAMERA, CONTROL_FREQ_HZ, ROBOT, prepare_robosuite

    prepare_robosuite()
    import robosuite as suite
    from robosuite.controllers import load_composite_controller_config

    return suite.make("Lift", robots=ROBOT, controller_configs=load_composite_controller_config(controller=None, robot=ROBOT),
                      has_renderer=False, has_offscreen_renderer=True, use_camera_obs=False, camera_names=CAMERA,
                      camera_heights=SIZE, camera_widths=SIZE, control_freq=CONTROL_FREQ_HZ, ignore_done=True,
                      reward_shaping=False, seed=seed)


def _robosuite_frame(env: Any, finish: bool = False) -> tuple[np.ndarray, bool]:
    """One frame through robosuite's render context; whether anything was written into the buffer."""
    import mujoco

    from trainers.sim.env import CAMERA

    context = env.sim._render_context_offscreen
    context.render(SIZE, SIZE, camera_id=env.sim.model.camera_name2id(CAMERA))
    if finish:
        from OpenGL import GL

        GL.glFinish()
    sentinel = np.full((SIZE, SIZE, 3), 7, dtype=np.uint8)
    mujoco.mjr_readPixels(rgb=sentinel, depth=None, viewport=mujoco.MjrRect(0, 0, SIZE, SIZE), con=context.con)
    return sentinel, bool((sentinel != 7).any())


def _bad(frame: np.ndarray, written: bool) -> bool:
    from trainers.sim.env import is_noise

    return not written or is_noise(frame)


def _count_bad(env: Any, frames: int, between: Callable[[], None] = lambda: None) -> int:
    bad = 0
    for _ in range(frames):
        between()
        bad += _bad(*_robosuite_frame(env))
    return bad


def first_context_fresh_cache(processes: int = 3) -> dict[str, Any]:
    """A new process each time, an empty Mesa shader cache each time, the first frames of its first context."""
    code = ("import gc, json, sys; gc.disable(); from bench.render_noise import _robosuite_env, _count_bad; "
            "env = _robosuite_env(0); env.reset(); print(json.dumps(_count_bad(env, 5)))")
    bad = 0
    for _ in range(processes):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "MESA_SHADER_CACHE_DIR": cache, "MESA_GLSL_CACHE_DIR": cache}
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            bad += json.loads(out.stdout.strip().splitlines()[-1])
    return {"bad": bad, "frames": 5 * processes}


def concurrent_load(frames: int = 200) -> dict[str, Any]:
    """Busy loops on every core while one env renders (the garbage collector off, to test load alone)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        gc.disable()
        env = _robosuite_env(0)
        env.reset()
        bad = _count_bad(env, frames, lambda: env.step(np.zeros(7)) and None)
        return {"bad": bad, "frames": frames, "hogs": len(hogs)}
    finally:
        gc.enable()
        for hog in hogs:
            hog.kill()
            hog.wait()


def read_before_finish(frames: int = 200) -> dict[str, Any]:
    """The same states rendered with and without glFinish before glReadPixels: do the bytes differ?"""
    gc.disable()
    try:
        env = _robosuite_env(0)
        env.reset()
        differ = 0
        for _ in range(frames):
            env.step(np.zeros(7))
            plain, _ = _robosuite_frame(env)
            finished, _ = _robosuite_frame(env, finish=True)
            differ += not np.array_equal(plain, finished)
        return {"differing": differ, "frames": frames}
    finally:
        gc.enable()


def shared_across_envs(frames: int = 5) -> dict[str, Any]:
    """Two envs in one process; one closes; the other keeps rendering."""
    gc.disable()
    try:
        first, second = _robosuite_env(0), _robosuite_env(1)
        before = _count_bad(second, frames)
        first.close()
        del first
        gc.collect()
        return {"bad_before": before, "bad_after_other_closed": _count_bad(second, frames), "frames": frames}
    finally:
        gc.enable()


def gc_after_hard_reset(frames: int = 5) -> dict[str, Any]:
    """A hard reset, then one run of the garbage collector, then frames; then the next reset."""
    gc.disable()
    try:
        env = _robosuite_env(0)
        env.reset()
        before = _count_bad(env, frames)
        collected = gc.collect()
        after = _count_bad(env, frames)
        env.reset()
        return {"bad_before_gc": before, "objects_collected": collected, "bad_after_gc": after,
                "bad_after_next_reset": _count_bad(env, frames), "frames": frames}
    finally:
        gc.enable()


def camera_same_scenarios(frames: int = 20) -> dict[str, Any]:
    """trainers.sim.env.Camera through both failing scenarios: hard resets with collections, two cameras."""
    from trainers.sim.env import Camera, RenderError, make_env

    bad = 0
    env, other = make_env("Lift", seed=0), make_env("Lift", seed=1)
    try:
        for _ in range(3):
            env.reset()
            gc.collect()
            with Camera(env.sim, SIZE) as camera:
                with Camera(other.sim, SIZE) as second:
                    second.frame()
                for _ in range(frames):
                    env.step(np.zeros(7))
                    gc.collect()
                    try:
                        camera.frame()
                    except RenderError:
                        bad += 1
    finally:
        env.close()
        other.close()
    return {"bad": bad, "frames": 3 * frames}


EXPERIMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "first EGL context, fresh process, empty Mesa shader cache": first_context_fresh_cache,
    "concurrent load (busy loops on every core)": concurrent_load,
    "reading pixels before the render finishes": read_before_finish,
    "a context shared across environments": shared_across_envs,
    "the garbage collector frees a hard reset's previous sim": gc_after_hard_reset,
    "the fix: Camera under resets, collections and a second camera": camera_same_scenarios,
}


def main() -> None:
    results = {}
    for name, experiment in EXPERIMENTS.items():
        started = time.perf_counter()
        results[name] = {**experiment(), "seconds": round(time.perf_counter() - started, 1)}
        print(f"{name}: {json.dumps(results[name])}", flush=True)


if __name__ == "__main__":
    main()
