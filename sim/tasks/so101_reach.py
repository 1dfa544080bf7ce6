"""so101_reach: bring the SO-101's tool frame to a random target point above the table."""

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
class ReachConfig(common.ArmTaskConfig):
    """so101_reach. Positions in metres in the world frame (the arm's base at the origin, +x in front)."""

    episode_length: int = 100  # control steps (30 Hz: 3.3 s)
    init_joint_noise: float = 0.1  # rad, uniform noise around the home pose at reset
    target_low: list[float] = field(default_factory=lambda: [0.10, -0.22, 0.03])  # m
    target_high: list[float] = field(default_factory=lambda: [0.32, 0.22, 0.28])  # m
    success_threshold: float = 0.02  # m, tool-to-target distance that counts as reached
    # Targets the arm cannot reach are drawn again. The tool frame cannot fold closer than ~0.13 m to the base's
    # vertical axis between 4 and 21 cm up (shoulder_lift stops at -1.745 rad): damped-least-squares IK from 4 starts
    # left 1.3 % of the box's targets > 2 cm away, all of them inside this cylinder; the scripted expert and a trained
    # PPO policy stalled 2.9-3.2 cm from one (2026-12-06). Excluded: 2.4 % of the box. unreachable_radius 0 draws the box.
    unreachable_radius: float = 0.13  # m, from the base's z axis
    unreachable_z: list[float] = field(default_factory=lambda: [0.04, 0.21])  # m, the cylinder's bottom and top
    # The shared table scene holds a cube that reach never reads. Simulating it (a free body resting on the table
    # through 4 elliptic-cone contacts) made each physics step 1.4x the arm's alone: 15.2-15.7 vs 10.8-10.9 us on this
    # machine kind, one MjData, the arm moving (main_job.json, scene_cube_ab_2026_12_05). Off, the scene has the arm, the
    # table and the target only; on, the cube stays as a visual distractor (vla_bc.py's reach data were recorded with it).
    scene_cube: bool = False
    reward_weights: dict[str, float] = field(
        default_factory=lambda: {"distance": 1.0, "near": 0.0, "success": 10.0, "action_rate": 0.01}
    )

    def __post_init__(self) -> None:
        if len(self.unreachable_z) != 2 or not self.unreachable_z[0] < self.unreachable_z[1]:
            raise ValueError(f"task.unreachable_z must be [bottom, top] with bottom < top (m), got {self.unreachable_z}")


# The observation, part by part (positions in m, world frame; 0.1 * joint velocities in rad/s; actions in [-1, 1]).
POLICY_PARTS = (("joint_pos", 6), ("joint_vel", 6), ("ee_pos", 3), ("target_pos", 3), ("target_rel", 3),
                ("last_action", 6))


class ReachTask(common.ArmTask):
    name = "so101_reach"
    instruction = "Move the gripper to the green target."
    reward_term_names = ("distance", "near", "success", "action_rate")
    cfg: ReachConfig

    def build_spec(self) -> mujoco.MjSpec:
        spec = common.scene_spec(sites=("ee",), markers=("target",))
        if not self.cfg.scene_cube:  # MuJoCo drops the cube's free joint from the home keyframe; the arm's pose stays
            spec.delete(spec.body("cube"))
        return spec

    def bind(self, model: mujoco.MjModel, num_envs: int, device: torch.device) -> None:
        self.arm = so101.SO101Arm(model, device, self.cfg.max_delta, self.cfg.max_delta_gripper, self.cfg.action_mode)
        self.home = common.home_state(model, device)
        self.target_mocap = int(model.body_mocapid[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "target")])
        self.target = torch.zeros(num_envs, 3, device=device)
        self.last_action = torch.zeros(num_envs, 6, device=device)
        self.prev_action = torch.zeros(num_envs, 6, device=device)
        self.low = torch.tensor(self.cfg.target_low, device=device)
        self.high = torch.tensor(self.cfg.target_high, device=device)

    def obs_spec(self) -> ObsSpec:
        return ObsSpec.from_parts({keys.POLICY: POLICY_PARTS, keys.CRITIC: POLICY_PARTS,
                                   keys.PROPRIO: common.PROPRIO_PARTS})

    def reset(self, state: SimState, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        common.reset_arm(state, self.arm, self.home, env_ids, gen, self.cfg.init_joint_noise)
        self.target[env_ids] = self._draw_targets(len(env_ids), gen)
        state.mocap_pos[env_ids, self.target_mocap] = self.target[env_ids].to(state.mocap_pos.dtype)
        self.last_action[env_ids] = 0.0
        self.prev_action[env_ids] = 0.0

    def _draw_targets(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, 3] targets uniform over the box less the unreachable cylinder (rejected ones drawn again)."""
        target = torch.empty(n, 3, device=self.target.device)
        todo = torch.arange(n, device=self.target.device)
        for _ in range(1000):
            u = torch.rand(len(todo), 3, generator=gen).to(self.target.device)
            target[todo] = self.low + u * (self.high - self.low)
            todo = todo[self.unreachable(target[todo])]
            if len(todo) == 0:
                return target
        raise ValueError(f"so101_reach: 1000 draws from target_low {self.cfg.target_low} / target_high "
                         f"{self.cfg.target_high} found no target outside the unreachable cylinder (unreachable_radius "
                         f"{self.cfg.unreachable_radius} m, unreachable_z {self.cfg.unreachable_z} m)")

    def unreachable(self, target: torch.Tensor) -> torch.Tensor:
        """bool [N]: targets [N, 3] in the cylinder round the base that the tool frame cannot reach."""
        z_low, z_high = self.cfg.unreachable_z
        return ((torch.linalg.norm(target[:, :2], dim=1) < self.cfg.unreachable_radius)
                & (target[:, 2] > z_low) & (target[:, 2] < z_high))

    def action_to_ctrl(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        self.prev_action.copy_(self.last_action)
        self.last_action.copy_(action)
        return self.arm.action_to_ctrl(state.qpos, state.ctrl, action)

    def _distance(self, state: SimState) -> torch.Tensor:
        return torch.linalg.norm(state.sensor("ee_pos").float() - self.target, dim=1)

    def observations(self, state: SimState) -> Obs:
        q, ee = self.arm.qpos(state.qpos), state.sensor("ee_pos").float()
        obs = common.concat({"joint_pos": q, "joint_vel": 0.1 * self.arm.qvel(state.qvel), "ee_pos": ee,
                             "target_pos": self.target, "target_rel": self.target - ee,
                             "last_action": self.last_action}, POLICY_PARTS)
        return {keys.POLICY: obs, keys.CRITIC: obs, keys.PROPRIO: q}

    def reward_terms(self, state: SimState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        d = self._distance(state)
        return {
            "distance": -d,  # m; negative so that ending early (success) is never avoided
            "near": torch.exp(-d / 0.02) - 1.0,  # sharper pull within a few cm, <= 0
            "success": self.success(state).float(),
            "action_rate": -torch.sum((self.last_action - self.prev_action) ** 2, dim=1),
        }

    def success(self, state: SimState) -> torch.Tensor:
        return self._distance(state) < self.cfg.success_threshold

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        return {"target": self.target, "last_action": self.last_action, "prev_action": self.prev_action}
