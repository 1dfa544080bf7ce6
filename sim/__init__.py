"""Simulator backends behind the VecEnv contract, the SO-101 and humanoid tasks, assets and scripted experts.

Importing ``sim`` registers the gymnasium ids (``robot_rl/SO101Lift-v0`` ...).
"""

import ctypes.util
import os

import robot_rl  # noqa: F401  (first: it sets OpenMP's spin default before torch loads)

# MuJoCo picks its OpenGL backend when it is first imported: offscreen EGL by default, OSMesa where there is
# no EGL library (Debian: libosmesa6), unless the user chose one.
if "MUJOCO_GL" not in os.environ:
    os.environ["MUJOCO_GL"] = "egl" if ctypes.util.find_library("EGL") or not ctypes.util.find_library("OSMesa") \
        else "osmesa"

from sim.gym import register_envs

register_envs()
