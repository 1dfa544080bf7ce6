"""Simulator backends behind the VecEnv contract, the SO-101 and humanoid tasks, assets and scripted experts.

Importing ``sim`` registers the gymnasium ids (``robot_rl/SO101Lift-v0`` ...).
"""

from sim.gym import register_envs

register_envs()
