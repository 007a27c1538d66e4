"""One place that builds robosuite environments and renders their camera, so demos and replay agree.

Rendering is ours, not robosuite's: robosuite's offscreen renderer (``MjRenderContext``) never makes
its GL context current before drawing, and frees its GL objects in whatever context happens to be
current. A hard ``env.reset()`` leaves the previous sim and its render context in a reference cycle;
when Python's cyclic garbage collector frees them — at an allocation count, not at a point in the
program — their cleanup deletes the *new* context's framebuffer (same object names) and releases
the thread's current context. Every later frame until the next reset is then whatever the output
buffer held: noise, or a stale copy of the previous frame. That was the quickstart's "agentview
camera renders noise twice in a row" (details and the experiments: ``bench/render_noise.py``).

:class:`Camera` renders with MuJoCo's own ``mujoco.Renderer``, which makes its context current on
every frame and is closed explicitly by whoever opened it; robosuite envs are built without a
renderer (``has_offscreen_renderer=False``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

ROBOT = "Panda"
CONTROL_FREQ_HZ = 20
CAMERA = "agentview"
NOISE_GRADIENT = 40.0
"""Mean |horizontal pixel difference| above which a frame is noise, not a scene (scenes here: 3-8)."""


class RenderError(RuntimeError):
    """The camera produced no picture (nothing drawn, or noise): a broken GL setup, never retried."""


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def prepare_robosuite() -> None:
    """Before the first ``import mujoco``/``import robosuite`` of the process: renderer and log level.

    ``MUJOCO_GL=egl`` (Mesa's EGL device platform, llvmpipe on the CPU) unless the user chose
    another; MuJoCo reads it once, at import. robosuite logs five warnings at import (no private
    macro file, no robosuite_models, no mink IK) that concern features this project does not use:
    a filter on its logger keeps errors only. robosuite resets the logger's level when it creates
    it, but keeps its filters, so the filter goes on before the import.
    """
    os.environ.setdefault("MUJOCO_GL", "egl")
    logger = logging.getLogger("robosuite_logs")
    if not any(isinstance(f, _BelowError) for f in logger.filters):
        logger.addFilter(_BelowError())


def make_env(env_name: str, *, seed: int | None = None) -> Any:
    """A robosuite env with the Panda's default (OSC pose) controller and no renderer of its own."""
    prepare_robosuite()
    import robosuite as suite
    from robosuite.controllers import load_composite_controller_config

    return suite.make(
        env_name,
        robots=ROBOT,
        controller_configs=load_composite_controller_config(controller=None, robot=ROBOT),
        has_renderer=False,
        has_offscreen_renderer=False,
        use_camera_obs=False,
        control_freq=CONTROL_FREQ_HZ,
        ignore_done=True,
        reward_shaping=False,
        seed=seed,
    )


def env_kwargs(env: Any, camera_size: int | None) -> dict[str, Any]:
    """The constructor arguments robomimic stores in ``env_args`` (JSON-able).

    With ``camera_size`` they describe the camera the frames were rendered with, so that robomimic
    rebuilding the env gets the same ``agentview_image`` observation.
    """
    with_camera = camera_size is not None
    return {
        "robots": [ROBOT],
        "controller_configs": env.robots[0].composite_controller_config,
        "has_renderer": False,
        "has_offscreen_renderer": with_camera,
        "use_camera_obs": with_camera,
        "camera_names": [CAMERA] if with_camera else [],
        "camera_heights": [camera_size] if with_camera else [],
        "camera_widths": [camera_size] if with_camera else [],
        "control_freq": CONTROL_FREQ_HZ,
        "ignore_done": True,
        "reward_shaping": False,
    }


def frame_gradient(frame: np.ndarray) -> float:
    """Mean |horizontal pixel difference|: 3-8 for a scene here, ~85 for uniform noise."""
    return float(np.abs(np.diff(frame.astype(np.int16), axis=1)).mean())


def is_noise(frame: np.ndarray) -> bool:
    return frame_gradient(frame) > NOISE_GRADIENT


class Camera:
    """Square frames of one fixed camera of a robosuite sim, upright, rendered by ``mujoco.Renderer``.

    Bound to the sim's model: a hard ``env.reset()`` builds a new model, so open a camera after the
    reset and close it before the next one (``with Camera(env.sim, 64) as camera: ...``). Same
    scene as robosuite's camera observation (visual meshes, not collision meshes); ``fast`` turns
    off shadows, reflections and multisampling (a step with a frame 2.0× as fast on llvmpipe: bench/sim.py).

    Every frame is checked: one that nothing was drawn into, or that is noise, raises
    :class:`RenderError` rather than entering a data set.
    """

    def __init__(self, sim: Any, size: int, *, camera: str = CAMERA, fast: bool = True) -> None:
        prepare_robosuite()
        import mujoco

        model = sim.model._model
        self._model, self._data = model, sim.data._data
        self._scratch = mujoco.MjData(model)
        self._camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if self._camera_id < 0:
            raise ValueError(f"the model has no camera {camera!r}")
        self.camera, self.size = camera, size
        self._option = mujoco.MjvOption()
        self._option.geomgroup[0] = 0  # collision meshes (robosuite: render_collision_mesh=False)
        self._option.geomgroup[1] = 1  # visual meshes (robosuite: render_visual_mesh=True)
        # The context's framebuffer takes the model's multisampling when it is made: 4 samples (robosuite's
        # default) cost 45 ms of llvmpipe CPU per 64×64 frame, none 26 ms. The model keeps its own value.
        samples = model.vis.quality.offsamples
        if fast:
            model.vis.quality.offsamples = 0
        try:
            self._renderer = mujoco.Renderer(model, height=size, width=size)
        finally:
            model.vis.quality.offsamples = samples
        if fast:
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0

    def frame(self) -> np.ndarray:
        """The camera's view of the sim's current positions, (size, size, 3) uint8, rows top-down.

        Rendered from a private copy of the positions with the kinematics recomputed, so the frame
        is a function of ``sim.get_state()`` alone (after ``mj_step`` the sim's own geom poses lag
        its joint positions by one physics substep) and the sim's data is never touched.
        """
        import mujoco

        if self._renderer is None:
            raise RenderError(f"the {self.camera} camera is closed")
        scratch = self._scratch
        scratch.qpos[:] = self._data.qpos
        scratch.mocap_pos[:] = self._data.mocap_pos
        scratch.mocap_quat[:] = self._data.mocap_quat
        mujoco.mj_fwdPosition(self._model, scratch)
        self._renderer.update_scene(scratch, camera=self._camera_id, scene_option=self._option)
        frame = self._renderer.render(out=np.zeros((self.size, self.size, 3), dtype=np.uint8))
        if not frame.any():
            raise RenderError(f"the {self.camera} camera drew nothing (MUJOCO_GL={os.environ.get('MUJOCO_GL')}): "
                              f"run `idmctl doctor`")
        if is_noise(frame):
            raise RenderError(f"the {self.camera} camera rendered noise (mean gradient {frame_gradient(frame):.0f} > "
                              f"{NOISE_GRADIENT:.0f}; MUJOCO_GL={os.environ.get('MUJOCO_GL')}): run `idmctl doctor`")
        return frame

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __enter__(self) -> Camera:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A camera left open is closed by the garbage collector: mujoco's close frees our context only.
        try:
            self.close()
        except Exception:
            pass


def render_check(size: int = 64) -> dict[str, Any]:
    """One agentview frame of a freshly reset Lift scene, checked like every demo frame (``idmctl doctor``)."""
    env = make_env("Lift", seed=0)
    try:
        env.reset()
        with Camera(env.sim, size) as camera:
            frame = camera.frame()
            from OpenGL import GL  # the camera's context is current right after a frame

            renderer = GL.glGetString(GL.GL_RENDERER)
    finally:
        env.close()
    return {"camera": CAMERA, "size": size, "gradient": frame_gradient(frame), "noise_above": NOISE_GRADIENT,
            "mujoco_gl": os.environ.get("MUJOCO_GL", ""),
            "gl_renderer": renderer.decode(errors="replace") if isinstance(renderer, bytes) else str(renderer)}


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
