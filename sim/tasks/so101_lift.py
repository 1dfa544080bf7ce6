"""so101_lift: grasp a randomly placed 2.5 cm cube and lift it 5 cm off the table."""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec
from sim import so101
from sim.state import SimState
from sim.tasks import common

CUBE_HALF = 0.0125  # m, half the cube's side


@dataclass
class LiftConfig(common.ArmTaskConfig):
    """so101_lift. Positions in metres in the world frame (the arm's base at the origin, +x in front)."""

    cube_low: list[float] = field(default_factory=lambda: [0.16, -0.08])  # m, x y of the cube's spawn box
    cube_high: list[float] = field(default_factory=lambda: [0.24, 0.08])  # m
    cube_yaw: float = 0.7854  # rad, cube yaw drawn from [-cube_yaw, cube_yaw]
    lift_height: float = 0.05  # m above the resting height that counts as lifted
    # pads: credit per pad touching the cube, off by default (the results of FlashSAC, the datasets and the VLAs were
    # measured without it). PPO's lift recipe turns it on (configs/algo_task/ppo_so101_lift.yaml): without it PPO
    # can sit for millions of env steps with the gripper wide open beside the cube, since a partial close pushes the
    # cube away and only both pads at once earned anything (ppo_vs_sb3.json -> lift_seed_fragility_2026_12_05).
    # near: a pull that steepens within a few cm of the cube, off by default for the same reason; PPO's recipe turns
    # it on with the gripper's action as an opening (lift_gripper_opening_2026_12_05).
    reward_weights: dict[str, float] = field(
        default_factory=lambda: {"reach": 2.0, "grasp": 0.5, "lift": 2.0, "success": 20.0, "pads": 0.0, "near": 0.0}
    )
    near_scale: float = 0.05  # m, the distance scale of the "near" term, exp(-d / near_scale) - 1


# The observation, part by part (positions in m, world frame; 0.1 * joint velocities in rad/s; the cube's quaternion
# w x y z; pad contacts 1/0; actions in [-1, 1]). The critic adds the cube's velocity (m/s).
POLICY_PARTS = (("joint_pos", 6), ("joint_vel", 6), ("grasp_pos", 3), ("cube_pos", 3), ("cube_rel", 3),
                ("cube_quat", 4), ("pad_contacts", 2), ("last_action", 6))
CRITIC_PARTS = (*POLICY_PARTS, ("cube_linvel", 3))


class LiftTask(common.ArmTask):
    name = "so101_lift"
    instruction = "Pick up the red cube and lift it."
    reward_term_names = ("reach", "grasp", "lift", "success", "pads", "near")
    cfg: LiftConfig

    def build_spec(self) -> mujoco.MjSpec:
        spec = common.scene_spec(sites=("grasp",), bodies=("cube",), quats=("cube",), linvel_bodies=("cube",))
        common.add_pad_contacts(spec, "cube")
        return spec

    def bind(self, model: mujoco.MjModel, num_envs: int, device: torch.device) -> None:
        self.arm = so101.SO101Arm(model, device, self.cfg.max_delta, self.cfg.max_delta_gripper, self.cfg.action_mode)
        self.home = common.home_state(model, device)
        jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "cube")
        self.cube_qadr = int(model.jnt_qposadr[jid])
        self.cube_dadr = int(model.jnt_dofadr[jid])
        self.last_action = torch.zeros(num_envs, 6, device=device)
        self.low = torch.tensor(self.cfg.cube_low, device=device)
        self.high = torch.tensor(self.cfg.cube_high, device=device)

    def obs_spec(self) -> ObsSpec:
        return ObsSpec.from_parts({keys.POLICY: POLICY_PARTS, keys.CRITIC: CRITIC_PARTS,
                                   keys.PROPRIO: common.PROPRIO_PARTS})

    def reset(self, state: SimState, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        common.reset_arm(state, self.arm, self.home, env_ids, gen, self.cfg.init_joint_noise)
        common.place_cube(state, env_ids, gen, self.cube_qadr, self.cube_dadr, self.low, self.high, self.cfg.cube_yaw)
        self.last_action[env_ids] = 0.0

    def action_to_ctrl(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        self.last_action.copy_(action)
        return self.arm.action_to_ctrl(state.qpos, state.ctrl, action)

    def _pads(self, state: SimState) -> torch.Tensor:
        """bool [N, 2]: the fixed and the moving pad touch the cube."""
        return state.derived("so101_lift.pads", lambda: torch.stack(
            [state.sensor("fixed_pad_contact")[:, 0], state.sensor("moving_pad_contact")[:, 0]], dim=1) > 0)

    def _grasped(self, state: SimState) -> torch.Tensor:
        return state.derived("so101_lift.grasped", lambda: self._pads(state).all(dim=1))

    def _height(self, state: SimState) -> torch.Tensor:
        return state.derived("so101_lift.height", lambda: state.sensor("cube_pos")[:, 2].float() - CUBE_HALF)

    def observations(self, state: SimState) -> Obs:
        grasp, cube = state.sensor("grasp_pos").float(), state.sensor("cube_pos").float()
        contacts = self._pads(state).float()
        q = self.arm.qpos(state.qpos)
        parts = {"joint_pos": q, "joint_vel": 0.1 * self.arm.qvel(state.qvel), "grasp_pos": grasp, "cube_pos": cube,
                 "cube_rel": cube - grasp, "cube_quat": state.sensor("cube_quat").float(), "pad_contacts": contacts,
                 "last_action": self.last_action, "cube_linvel": state.sensor("cube_linvel").float()}
        critic = common.concat(parts, CRITIC_PARTS)
        return {keys.POLICY: critic[:, :-3], keys.CRITIC: critic, keys.PROPRIO: q}

    def reward_terms(self, state: SimState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        d = torch.linalg.norm(state.sensor("cube_pos").float() - state.sensor("grasp_pos").float(), dim=1)
        h, grasped = self._height(state), self._grasped(state)
        # Every shaping term is <= 0 so that finishing early (success ends the episode) is never avoided.
        return {
            "reach": -d,  # m
            "grasp": grasped.float() - 1.0,
            "lift": -(self.cfg.lift_height - h).clamp(0.0, self.cfg.lift_height) / self.cfg.lift_height,
            "success": self.success(state).float(),
            "pads": self._pads(state).float().mean(dim=1) - 1.0,  # -1 neither pad on the cube, -0.5 one, 0 both
            "near": torch.exp(-d / self.cfg.near_scale) - 1.0,  # a pull that steepens within a few cm, <= 0
        }

    def success(self, state: SimState) -> torch.Tensor:
        return state.derived("so101_lift.success",
                             lambda: (self._height(state) >= self.cfg.lift_height) & self._grasped(state))

    def terminated(self, state: SimState) -> torch.Tensor:
        return state.sensor("cube_pos")[:, 2] < -0.05  # fell off the table

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        return {"last_action": self.last_action}

