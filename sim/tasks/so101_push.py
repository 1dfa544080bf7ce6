"""so101_push: push a 2.5 cm cube along the table onto a marked goal spot."""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec
from sim import so101
from sim.state import SimState
from sim.tasks import common


@dataclass
class PushConfig(common.ArmTaskConfig):
    """so101_push. Positions in metres in the world frame (the arm's base at the origin, +x in front)."""

    episode_length: int = 200  # control steps (30 Hz: 6.7 s)
    cube_low: list[float] = field(default_factory=lambda: [0.17, -0.05])  # m, x y of the cube's spawn box
    cube_high: list[float] = field(default_factory=lambda: [0.23, 0.05])  # m
    push_distance: list[float] = field(default_factory=lambda: [0.06, 0.09])  # m, cube-to-goal distance range
    goal_angle: float = 0.5236  # rad, goal direction within +-goal_angle of the +y or the -y axis (a sideways push)
    success_threshold: float = 0.025  # m, cube-to-goal distance in the table plane that counts as placed
    reward_weights: dict[str, float] = field(
        default_factory=lambda: {"reach": 1.0, "push": 5.0, "success": 20.0}
    )


# The observation, part by part (positions in m, world frame; goal xy on the table; 0.1 * joint velocities in
# rad/s; actions in [-1, 1]). The critic adds the cube's velocity (m/s).
POLICY_PARTS = (("joint_pos", 6), ("joint_vel", 6), ("ee_pos", 3), ("cube_pos", 3), ("cube_rel", 3),
                ("goal_pos", 2), ("goal_rel", 2), ("last_action", 6))
CRITIC_PARTS = (*POLICY_PARTS, ("cube_linvel", 3))


class PushTask(common.ArmTask):
    name = "so101_push"
    instruction = "Push the red cube onto the blue circle."
    reward_term_names = ("reach", "push", "success")
    cfg: PushConfig

    def build_spec(self) -> mujoco.MjSpec:
        spec = common.scene_spec(sites=("ee", "grasp"), bodies=("cube",), linvel_bodies=("cube",), markers=("goal",))
        return spec

    def bind(self, model: mujoco.MjModel, num_envs: int, device: torch.device) -> None:
        self.arm = so101.SO101Arm(model, device, self.cfg.max_delta, self.cfg.max_delta_gripper, self.cfg.action_mode)
        self.home = common.home_state(model, device)
        jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "cube")
        self.cube_qadr, self.cube_dadr = int(model.jnt_qposadr[jid]), int(model.jnt_dofadr[jid])
        self.goal_mocap = int(model.body_mocapid[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "goal")])
        self.goal = torch.zeros(num_envs, 2, device=device)
        self.last_action = torch.zeros(num_envs, 6, device=device)
        self.low = torch.tensor(self.cfg.cube_low, device=device)
        self.high = torch.tensor(self.cfg.cube_high, device=device)

    def obs_spec(self) -> ObsSpec:
        return ObsSpec.from_parts({keys.POLICY: POLICY_PARTS, keys.CRITIC: CRITIC_PARTS,
                                   keys.PROPRIO: common.PROPRIO_PARTS})

    def reset(self, state: SimState, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        common.reset_arm(state, self.arm, self.home, env_ids, gen, self.cfg.init_joint_noise)
        xy = common.place_cube(state, env_ids, gen, self.cube_qadr, self.cube_dadr, self.low, self.high, 0.0)
        n = len(env_ids)
        u = torch.rand(n, 3, generator=gen).to(xy.device)
        lo, hi = self.cfg.push_distance
        dist = lo + u[:, 0] * (hi - lo)
        # Sideways pushes (a sweep of shoulder_pan) keep the fingers low over the table everywhere in reach.
        side = torch.where(u[:, 2] < 0.5, torch.full_like(dist, torch.pi / 2), torch.full_like(dist, -torch.pi / 2))
        ang = side + (u[:, 1] * 2 - 1) * self.cfg.goal_angle
        self.goal[env_ids] = xy + torch.stack([torch.cos(ang), torch.sin(ang)], dim=1) * dist[:, None]
        pos = state.mocap_pos[env_ids, self.goal_mocap]
        pos[:, :2] = self.goal[env_ids].to(pos.dtype)
        state.mocap_pos[env_ids, self.goal_mocap] = pos
        self.last_action[env_ids] = 0.0

    def action_to_ctrl(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        self.last_action.copy_(action)
        return self.arm.action_to_ctrl(state.qpos, state.ctrl, action)

    def _goal_distance(self, state: SimState) -> torch.Tensor:
        return torch.linalg.norm(state.sensor("cube_pos")[:, :2].float() - self.goal, dim=1)

    def observations(self, state: SimState) -> Obs:
        ee, cube = state.sensor("ee_pos").float(), state.sensor("cube_pos").float()
        q = self.arm.qpos(state.qpos)
        parts = {"joint_pos": q, "joint_vel": 0.1 * self.arm.qvel(state.qvel), "ee_pos": ee, "cube_pos": cube,
                 "cube_rel": cube - ee, "goal_pos": self.goal, "goal_rel": self.goal - cube[:, :2],
                 "last_action": self.last_action, "cube_linvel": state.sensor("cube_linvel").float()}
        critic = common.concat(parts, CRITIC_PARTS)
        return {keys.POLICY: critic[:, :-3], keys.CRITIC: critic, keys.PROPRIO: q}

    def reward_terms(self, state: SimState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        d_reach = torch.linalg.norm(state.sensor("cube_pos").float() - state.sensor("grasp_pos").float(), dim=1)
        return {
            "reach": -d_reach,  # m, keep the fingers at the cube
            "push": -self._goal_distance(state),  # m
            "success": self.success(state).float(),
        }

    def success(self, state: SimState) -> torch.Tensor:
        return self._goal_distance(state) < self.cfg.success_threshold

    def terminated(self, state: SimState) -> torch.Tensor:
        return state.sensor("cube_pos")[:, 2] < -0.05  # fell off the table

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        return {"goal": self.goal, "last_action": self.last_action}
