"""robosuite figures the quickstart depends on: physics steps/s, camera frames/s, replay time.

Reference in the same run: camera frames with MuJoCo's default rendering (shadows and
reflections on) against the demos' ``Camera(fast=True)``. ``python -m bench.sim [--fast]`` prints the figures as JSON.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.common import Figure, time_call, print_figures


def _steps(env: object, n: int, camera: object | None = None) -> None:
    for _ in range(n):
        env.step(np.zeros(7))  # type: ignore[attr-defined]
        if camera is not None:
            camera.frame()  # type: ignore[attr-defined]


def run(fast: bool) -> list[Figure]:
    import torch

    from trainers.sim.demos import collect_demos
    from trainers.sim.env import Camera, make_env
    from trainers.sim.replay import Replayer, eef_error_mm

    torch.set_num_threads(1)
    # Fast mode only proves the module runs (its single samples are not figures to quote): one repeat. The
    # full run's (30, 3) was (50, 5), minutes of rendering on 2 shared cores.
    steps, repeats = (10, 1) if fast else (30, 3)
    env = make_env("Lift", seed=0)
    env.reset()
    physics = [steps / s for s in time_call(lambda: _steps(env, steps), repeats)]
    with Camera(env.sim, 64, fast=False) as camera:
        default_render = [steps / s for s in time_call(lambda: _steps(env, steps, camera), repeats)]
    with Camera(env.sim, 64) as camera:
        fast = [steps / s for s in time_call(lambda: _steps(env, steps, camera), repeats)]
    env.close()
    demo = collect_demos("Lift", 1, seed=0, camera_size=64, horizon=steps).demos[0]
    replayer = Replayer("Lift")
    errors: list[float] = []

    def replay() -> None:
        track = replayer.eef_track(demo.model_file, demo.states[0], demo.actions)
        errors.append(eef_error_mm(track, demo.obs["robot0_eef_pos"]))

    replay_s = time_call(replay, repeats)
    return [
        Figure("physics steps (no camera)", "steps/s", physics, target="~250 steps/s unloaded (stack notes)",
               higher_is_better=True),
        Figure("steps with a 64×64 camera, Camera(fast=True)", "frames/s", fast, "default rendering", default_render,
               target="~25 frames/s unloaded; ≥ 2× the default", higher_is_better=True),
        Figure(f"replay of a {steps}-step demo (no camera)", "s", replay_s,
               note=f"EEF error of the exact replay: max {max(errors):.2e} mm"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true")
    args = parser.parse_args()
    print_figures(run(args.fast))


if __name__ == "__main__":
    main()
