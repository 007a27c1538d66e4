"""One place that builds robosuite environments, so demos and replay use the same settings."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

ROBOT = "Panda"
CONTROL_FREQ_HZ = 20
CAMERA = "agentview"


def _quiet_robosuite() -> None:
    # robosuite warns about its macro file and optional extras on every import; none apply here.
    import logging

    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)


def make_env(env_name: str, *, camera_size: int | None, seed: int | None = None) -> Any:
    """A robosuite env with the Panda's default (OSC pose) controller; camera frames when ``camera_size``.

    ``MUJOCO_GL=egl`` must be set before robosuite imports mujoco: it renders on the CPU here
    (osmesa needs a Debian package that is not installed).
    """
    os.environ.setdefault("MUJOCO_GL", "egl")
    import robosuite as suite
    from robosuite.controllers import load_composite_controller_config

    _quiet_robosuite()
    with_camera = camera_size is not None
    return suite.make(
        env_name,
        robots=ROBOT,
        controller_configs=load_composite_controller_config(controller=None, robot=ROBOT),
        has_renderer=False,
        has_offscreen_renderer=with_camera,
        use_camera_obs=with_camera,
        camera_names=CAMERA,
        camera_heights=camera_size or 84,
        camera_widths=camera_size or 84,
        control_freq=CONTROL_FREQ_HZ,
        ignore_done=True,
        reward_shaping=False,
        seed=seed,
    )


def env_kwargs(env: Any) -> dict[str, Any]:
    """The constructor arguments robomimic stores in ``env_args`` (JSON-able)."""
    return {
        "robots": [ROBOT],
        "controller_configs": env.robots[0].composite_controller_config,
        "has_renderer": False,
        "has_offscreen_renderer": bool(env.has_offscreen_renderer),
        "use_camera_obs": bool(env.use_camera_obs),
        "camera_names": list(env.camera_names),
        "camera_heights": [int(h) for h in env.camera_heights],
        "camera_widths": [int(w) for w in env.camera_widths],
        "control_freq": CONTROL_FREQ_HZ,
        "ignore_done": True,
        "reward_shaping": False,
    }


def fast_render(env: Any) -> None:
    """Turn off shadows and reflections: ~3× faster software (llvmpipe) rendering of small frames.

    A hard reset builds a new sim and render context, so call this after every ``env.reset()``.
    """
    import mujoco

    context = getattr(env.sim, "_render_context_offscreen", None)
    if context is not None:
        context.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


def settle_controllers(env: Any) -> None:
    """Make every controller's cached state a function of the sim state alone.

    Controllers cache the arm's pose, Jacobian and mass matrix and refresh them only after a sim
    step, and OSC pulls the null space toward the joints it saw at reset. Demos call this right
    after reset and replay calls it right after restoring the first state, so both plan the first
    action from the same numbers — which is what makes replay exact (0.000 mm).
    """
    env.sim.forward()
    for robot in env.robots:
        for controller in robot.composite_controller.part_controllers.values():
            controller.update(force=True)
            controller.update_initial_joints(np.array(controller.joint_pos))
            controller.reset_goal()
