"""Preallocated device buffers: rollouts [T, N, ...] (and, later, replay rings and episode stores)."""

from robot_rl.buffers.rollout import RolloutBuffer

__all__ = ["RolloutBuffer"]
