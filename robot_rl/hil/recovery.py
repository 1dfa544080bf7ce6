"""A goal-conditioned recovery policy in joint space (DESIGN.md §5): when the intervention agent sends an env back to
a good state (``robot_rl.hil.memory``), this drives the arm's joints there along the straight line in joint space,
no joint moving more than ``max_step`` per control step, and says when it is done: every joint within
``tolerance`` of the goal, or ``max_steps`` spent (a blocked joint does not hold the arm forever). It reads the
joints the arm reports and gives position targets in the same units (LeRobot's: degrees, the gripper 0..100), so it
runs on a real SO-101 as on the simulated one.

    recovery.start(envs, goals)           # bool [N], goals [n, J]
    targets = recovery.act(joints)        # [N, J] (rows of envs not recovering: their joints, hold)
    done = recovery.done(joints)          # bool [N]
"""

from __future__ import annotations

import torch


class JointRecovery:
    """Straight-line joint moves of N envs (see the module docstring).

    Args:
        num_envs: N.
        num_joints: J.
        max_step: the largest change of any joint's target per step (joint units).
        tolerance: a goal is reached when every joint is within this of it (joint units).
        max_steps: steps after which a recovery ends whether or not it arrived.
    """

    def __init__(self, num_envs: int, num_joints: int, max_step: float = 3.0, tolerance: float = 3.0,
                 max_steps: int = 40) -> None:
        if num_envs < 1 or num_joints < 1:
            raise ValueError(f"num_envs and num_joints must be >= 1, got {num_envs}, {num_joints}")
        if not max_step > 0 or not tolerance > 0 or max_steps < 1:
            raise ValueError(f"max_step and tolerance must be > 0 and max_steps >= 1, got {max_step}, {tolerance}, "
                             f"{max_steps}")
        self.max_step, self.tolerance, self.max_steps = float(max_step), float(tolerance), int(max_steps)
        self.goals = torch.zeros(num_envs, num_joints)
        self.steps = torch.zeros(num_envs, dtype=torch.long)
        self.active = torch.zeros(num_envs, dtype=torch.bool)

    def _joints(self, joints: torch.Tensor) -> torch.Tensor:
        joints = joints.detach().float().cpu()
        if joints.shape != self.goals.shape:
            raise ValueError(f"joints must be {list(self.goals.shape)}, got {list(joints.shape)}")
        return joints

    def start(self, envs: torch.Tensor, goals: torch.Tensor) -> None:
        """Envs ``envs`` (bool [N]) head for ``goals`` (float [n, J], one row per env in ``envs``, in env order)."""
        envs = envs.to(torch.bool).cpu()
        goals = goals.detach().float().cpu()
        if goals.shape != (int(envs.sum()), self.goals.shape[1]):
            raise ValueError(f"goals must be [{int(envs.sum())}, {self.goals.shape[1]}], got {list(goals.shape)}")
        if not bool(torch.isfinite(goals).all()):
            raise ValueError("recovery goals hold NaN or inf")
        self.goals[envs] = goals
        self.steps[envs] = 0
        self.active |= envs

    def act(self, joints: torch.Tensor) -> torch.Tensor:
        """Targets [N, J]: for a recovering env its joints moved toward the goal, the move scaled so no joint
        changes by more than ``max_step``; elsewhere the joints as they are."""
        q = self._joints(joints)
        delta = self.goals - q
        scale = (self.max_step / delta.abs().amax(dim=1).clamp_min(1e-9)).clamp(max=1.0)
        self.steps += self.active.long()
        return torch.where(self.active[:, None], q + delta * scale[:, None], q)

    def done(self, joints: torch.Tensor) -> torch.Tensor:
        """bool [N]: recovering envs that arrived or ran out of steps (they stop recovering)."""
        q = self._joints(joints)
        arrived = (self.goals - q).abs().amax(dim=1) <= self.tolerance
        finished = self.active & (arrived | (self.steps >= self.max_steps))
        self.active &= ~finished
        return finished

    def reset(self, env_ids: torch.Tensor | None) -> None:
        """Envs ``env_ids`` (all: None) stop recovering (an episode ended)."""
        idx = slice(None) if env_ids is None else env_ids.cpu()
        self.active[idx] = False
        self.steps[idx] = 0
