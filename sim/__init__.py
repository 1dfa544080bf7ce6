"""Simulator backends behind the VecEnv contract, the SO-101 and humanoid tasks, assets and scripted experts.

Importing ``sim`` registers the gymnasium ids (``robot_rl/SO101Lift-v0`` ...).
"""

import os

# MuJoCo picks its OpenGL backend when it is first imported: offscreen EGL unless the user chose (e.g. osmesa).
os.environ.setdefault("MUJOCO_GL", "egl")

from sim.gym import register_envs  # noqa: E402

register_envs()
