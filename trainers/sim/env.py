"""One place that builds robosuite environments and renders their camera, so demos and replay agree.

Rendering is ours, not robosuite's: robosuite's offscreen renderer (``MjRenderContext``) never makes
its GL context current before drawing, and frees its GL objects in whatever context happens to be
current. A hard ``env.reset()`` leaves the previous sim and its render context in a reference cycle;
when Python's cyclic garbage collector frees them — at an allocation count, not at a point in the
program — their cleanup deletes the *new* context's framebuffer (same object names) and releases
the thread's current context. Every later frame until the next reset is then whatever the output
buffer held: noise, or a stale copy of the previous frame. That was the quickstart's "agentview
camera renders noise twice in a row" (details and the experiments: ``bench/render_noise.py``).

:class:`Camera` renders with MuJoCo's own GL calls (what ``mujoco.Renderer`` does), making its context
current on every frame; it is closed explicitly by whoever opened it, and robosuite envs are built
without a renderer (``has_offscreen_renderer=False``).
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


RENDER_ASSET_PREFIXES = ("tex_", "mesh_", "hfield_", "skin_", "flex_")
"""Model fields whose arrays a render context holds copies of (textures, meshes, height fields, skins,
flexes: what ``mjr_makeContext`` uploads). Geoms, bodies and materials are read per frame from the scene."""


def render_assets(model: Any) -> bytes:
    """A digest of everything a render context copies from ``model``: two models with equal digests draw
    the same picture of equal positions from one context. Lift's hard reset changes the cube's size (a
    box geom, drawn from the scene), never a mesh or a texture, so its digest stays the same."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(dir(model)):
        value = getattr(model, name) if name.startswith(RENDER_ASSET_PREFIXES) else None
        if isinstance(value, np.ndarray):
            digest.update(name.encode())
            digest.update(str(value.shape).encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    for name in ("ntex", "nmesh", "nhfield", "nskin", "nflex"):
        digest.update(f"{name}={getattr(model, name)}".encode())
    visual = model.vis
    digest.update(np.array([visual.global_.offwidth, visual.global_.offheight, visual.quality.offsamples,
                            visual.quality.shadowsize]).tobytes())
    return digest.digest()


class Camera:
    """Square frames of one fixed camera of a robosuite sim, upright, rendered by MuJoCo's own GL calls.

    A hard ``env.reset()`` builds a new model: call :meth:`follow` with the new sim after each one. The
    render context (a GL context and MuJoCo's copy of the model's meshes and textures: ~1 s of llvmpipe
    CPU for the Panda's 352k mesh vertices) is kept when the new model's render assets are the same
    (:func:`render_assets`) and rebuilt otherwise. Same scene as robosuite's camera observation (visual
    meshes, not collision meshes); ``fast`` turns off shadows, reflections and multisampling (a step with
    a frame 2.0× as fast on llvmpipe: bench/sim.py). Close it explicitly (``with Camera(env.sim, 64) as
    camera: ...``): the GL context is made current before every frame and freed by whoever opened it.

    Every frame is checked: one that nothing was drawn into, or that is noise, raises
    :class:`RenderError` rather than entering a data set.
    """

    def __init__(self, sim: Any, size: int, *, camera: str = CAMERA, fast: bool = True) -> None:
        prepare_robosuite()
        import mujoco

        self.camera, self.size, self.fast = camera, size, fast
        self.contexts_made = 0  # 1, plus one per follow() onto a model with other render assets
        self._gl: Any = None
        self._context: Any = None
        self._assets = b""
        self._option = mujoco.MjvOption()
        self._option.geomgroup[0] = 0  # collision meshes (robosuite: render_collision_mesh=False)
        self._option.geomgroup[1] = 1  # visual meshes (robosuite: render_visual_mesh=True)
        self._rect = mujoco.MjrRect(0, 0, size, size)
        self.follow(sim)

    def follow(self, sim: Any) -> None:
        """Draw ``sim`` from now on (after a hard reset, the new one): the render context is rebuilt only
        when the new model's meshes, textures or offscreen buffer differ from the last one's."""
        import mujoco

        model = sim.model._model
        camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, self.camera)
        if camera_id < 0:
            raise ValueError(f"the model has no camera {self.camera!r}")
        if model.vis.global_.offwidth < self.size or model.vis.global_.offheight < self.size:
            raise ValueError(f"a {self.size}×{self.size} frame exceeds the model's offscreen buffer "
                             f"({model.vis.global_.offwidth}×{model.vis.global_.offheight})")
        # The context's framebuffer takes the model's multisampling when it is made: 4 samples (robosuite's
        # default) cost 45 ms of llvmpipe CPU per 64×64 frame, none 26 ms. The model keeps its own value.
        samples = model.vis.quality.offsamples
        if self.fast:
            model.vis.quality.offsamples = 0
        try:
            assets = render_assets(model)
            if self._context is None or assets != self._assets:
                self._make_context(model)
                self._assets = assets
        finally:
            model.vis.quality.offsamples = samples
        self._model, self._data = model, sim.data._data
        self._view = mujoco.MjvCamera()
        self._view.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._view.fixedcamid = camera_id
        self._scratch = mujoco.MjData(model)
        self._scene = mujoco.MjvScene(model, maxgeom=10_000)
        if self.fast:
            self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0

    def _make_context(self, model: Any) -> None:
        import mujoco
        from mujoco.rendering.classic.gl_context import GLContext

        self._free_context()
        if self._gl is None:
            self._gl = GLContext(self.size, self.size)
        self._gl.make_current()
        self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._context)
        self.contexts_made += 1

    def frame(self) -> np.ndarray:
        """The camera's view of the sim's current positions, (size, size, 3) uint8, rows top-down.

        Rendered from a private copy of the positions with the kinematics recomputed, so the frame
        is a function of ``sim.get_state()`` alone (after ``mj_step`` the sim's own geom poses lag
        its joint positions by one physics substep) and the sim's data is never touched.
        """
        if self._context is None:
            raise RenderError(f"the {self.camera} camera is closed")
        frame = self._render()
        if not frame.any():
            raise RenderError(f"the {self.camera} camera drew nothing (MUJOCO_GL={os.environ.get('MUJOCO_GL')}): "
                              f"run `idmctl doctor`")
        if is_noise(frame):
            raise RenderError(f"the {self.camera} camera rendered noise (mean gradient {frame_gradient(frame):.0f} > "
                              f"{NOISE_GRADIENT:.0f}; MUJOCO_GL={os.environ.get('MUJOCO_GL')}): run `idmctl doctor`")
        return frame

    def _render(self) -> np.ndarray:
        import mujoco

        scratch = self._scratch
        scratch.qpos[:] = self._data.qpos
        scratch.mocap_pos[:] = self._data.mocap_pos
        scratch.mocap_quat[:] = self._data.mocap_quat
        mujoco.mj_fwdPosition(self._model, scratch)
        mujoco.mjv_updateScene(self._model, scratch, self._option, None, self._view,
                               mujoco.mjtCatBit.mjCAT_ALL.value, self._scene)
        self._gl.make_current()
        mujoco.mjr_render(self._rect, self._scene, self._context)
        pixels = np.zeros((self.size, self.size, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(pixels, None, self._rect, self._context)
        return np.ascontiguousarray(np.flipud(pixels))  # OpenGL's rows run bottom-up

    def _free_context(self) -> None:
        if self._context is not None:
            self._gl.make_current()  # MuJoCo frees the context's GL objects in whatever context is current
            self._context.free()
            self._context = None

    def close(self) -> None:
        if self._gl is not None:
            self._free_context()
            self._gl.free()
            self._gl = None

    def __enter__(self) -> Camera:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A camera left open is closed by the garbage collector: it frees its own context only.
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
