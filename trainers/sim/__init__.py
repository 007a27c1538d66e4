"""robosuite (MuJoCo) demos and simulator evaluation by exact replay.

Import robosuite only through :func:`trainers.sim.env.make_env`, which sets ``MUJOCO_GL`` first.
"""
