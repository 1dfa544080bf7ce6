"""so101_pick: three 2.5 cm cubes (red, green, blue); the instruction names one, and only lifting that one succeeds.

Language decides: the colour is drawn per env at every reset, the instruction says it ("pick up the green cube"), and
the state observation carries it as a one-hot. Lifting another cube earns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec
from sim import so101
from sim.state import SimState
from sim.tasks import common

COLOURS = ("red", "green", "blue")  # index = the one-hot position and the ``target`` value
RGBA = {"red": (0.85, 0.15, 0.15, 1.0), "green": (0.15, 0.7, 0.2, 1.0), "blue": (0.15, 0.3, 0.85, 1.0)}
CUBE_HALF = 0.0125  # m, half the cube's side


def cube_name(colour: str) -> str:
    """Body, joint and geom name of a cube in the pick scene."""
    return f"cube_{colour}"


@dataclass
class PickConfig(common.ArmTaskConfig):
    """so101_pick. Positions in metres in the world frame (the arm's base at the origin, +x in front)."""

    cube_low: list[float] = field(default_factory=lambda: [0.15, -0.09])  # m, x y of the cubes' spawn box
    cube_high: list[float] = field(default_factory=lambda: [0.24, 0.09])  # m
    min_cube_distance: float = 0.05  # m, least distance between two cubes' centres at reset
    cube_yaw: float = 0.7854  # rad, each cube's yaw drawn from [-cube_yaw, cube_yaw]
    lift_height: float = 0.05  # m above the resting height that counts as lifted
    reward_weights: dict[str, float] = field(
        default_factory=lambda: {"reach": 2.0, "grasp": 0.5, "lift": 2.0, "success": 20.0}
    )

    def __post_init__(self) -> None:
        if len(self.cube_low) != 2 or len(self.cube_high) != 2:
            raise ValueError(f"cube_low and cube_high must be [x, y], got {self.cube_low} and {self.cube_high}")
        if self.min_cube_distance < 0:
            raise ValueError(f"min_cube_distance must be >= 0, got {self.min_cube_distance}")


# The observation, part by part (positions in m, world frame; 0.1 * joint velocities in rad/s; quaternions w x y z;
# the named colour as a one-hot in COLOURS order; pad contacts 1/0 of (fixed, moving) pad with each cube in COLOURS
# order; actions in [-1, 1]). The critic adds the named cube's offset from the grasp site and its velocity (m/s).
CUBE_PARTS = tuple(p for c in COLOURS for p in ((f"{cube_name(c)}_pos", 3), (f"{cube_name(c)}_quat", 4)))
POLICY_PARTS = (("joint_pos", 6), ("joint_vel", 6), ("grasp_pos", 3), ("target_onehot", 3), *CUBE_PARTS,
                ("pad_contacts", 6), ("last_action", 6))
CRITIC_PARTS = (*POLICY_PARTS, ("target_rel", 3), ("target_linvel", 3))


class PickTask(common.ArmTask):
    name = "so101_pick"
    instruction = "pick up the red cube"  # the text when red is named; ``instructions`` gives each env's own
    reward_term_names = ("reach", "grasp", "lift", "success")
    cfg: PickConfig

    def build_spec(self) -> mujoco.MjSpec:
        """The SO-101 scene with its one cube and the reach/push markers replaced by three coloured cubes."""
        names = [cube_name(c) for c in COLOURS]
        spec = common.scene_spec(sites=("grasp",))
        for body in ("cube", "target", "goal"):  # the green target sphere would pass for a cube in an image
            spec.delete(spec.body(body))
        home = spec.key("home")
        qpos = list(home.qpos)[:6]
        for i, (colour, name) in enumerate(zip(COLOURS, names)):
            pos = [0.2, 0.06 * (i - 1), CUBE_HALF]  # out of the way; every reset places them
            common.add_cube(spec, name, RGBA[colour], pos, CUBE_HALF)
            qpos += [*pos, 1.0, 0.0, 0.0, 0.0]
        home.qpos = qpos
        for name in names:
            for sensor, kind in (("pos", mujoco.mjtSensor.mjSENS_FRAMEPOS), ("quat", mujoco.mjtSensor.mjSENS_FRAMEQUAT),
                                 ("linvel", mujoco.mjtSensor.mjSENS_FRAMELINVEL)):
                spec.add_sensor(name=f"{name}_{sensor}", type=kind, objtype=mujoco.mjtObj.mjOBJ_BODY, objname=name)
            common.add_pad_contacts(spec, name, suffix=f"_{name}")
        return spec

    def bind(self, model: mujoco.MjModel, num_envs: int, device: torch.device) -> None:
        self.arm = so101.SO101Arm(model, device, self.cfg.max_delta, self.cfg.max_delta_gripper, self.cfg.action_mode)
        self.home = common.home_state(model, device)
        self.names = [cube_name(c) for c in COLOURS]
        jids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in self.names]
        self.cube_qadr = [int(model.jnt_qposadr[j]) for j in jids]
        self.cube_dadr = [int(model.jnt_dofadr[j]) for j in jids]
        self.target = torch.zeros(num_envs, dtype=torch.long, device=device)  # index into COLOURS
        self.last_action = torch.zeros(num_envs, 6, device=device)
        self.low = torch.tensor(self.cfg.cube_low, device=device)
        self.high = torch.tensor(self.cfg.cube_high, device=device)
        self._rows = torch.arange(num_envs, device=device)

    def obs_spec(self) -> ObsSpec:
        return ObsSpec.from_parts({keys.POLICY: POLICY_PARTS, keys.CRITIC: CRITIC_PARTS,
                                   keys.PROPRIO: common.PROPRIO_PARTS})

    def reset(self, state: SimState, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        common.reset_arm(state, self.arm, self.home, env_ids, gen, self.cfg.init_joint_noise)
        common.place_cubes(state, env_ids, gen, self.cube_qadr, self.cube_dadr, self.low, self.high,
                           self.cfg.cube_yaw, self.cfg.min_cube_distance, CUBE_HALF)
        self.target[env_ids] = torch.randint(0, len(COLOURS), (len(env_ids),), generator=gen).to(self.target.device)
        self.last_action[env_ids] = 0.0

    def instructions(self, num_envs: int) -> list[str]:
        return [f"pick up the {COLOURS[c]} cube" for c in self.target.tolist()]

    def action_to_ctrl(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        self.last_action.copy_(action)
        return self.arm.action_to_ctrl(state.qpos, state.ctrl, action)

    # --------------------------------------------------------------------------------- per-cube quantities
    # Per-cube readings are memoised once per physics step (``SimState.derived``); what depends on the named cube
    # (``self.target``, redrawn at reset) is indexed from them on every call.
    def _stack(self, state: SimState, sensor: str) -> torch.Tensor:
        """[N, 3 cubes, dim] of the per-cube sensor ``cube_<colour><sensor>``, cubes in COLOURS order."""
        return state.derived(f"so101_pick.stack{sensor}", lambda: torch.stack(
            [state.sensor(f"{n}{sensor}") for n in self.names], dim=1).float())

    def _contacts(self, state: SimState) -> torch.Tensor:
        """bool [N, 3 cubes, 2]: (fixed, moving) pad touching each cube."""
        return state.derived("so101_pick.contacts", lambda: torch.stack(
            [torch.stack([state.sensor(f"{pad}_contact_{n}")[:, 0] for pad in ("fixed_pad", "moving_pad")], dim=1)
             for n in self.names], dim=1) > 0)

    def _target_pos(self, state: SimState) -> torch.Tensor:
        return self._stack(state, "_pos")[self._rows, self.target]

    def _grasped(self, state: SimState) -> torch.Tensor:
        """bool [N]: both pads touch the named cube."""
        return self._contacts(state)[self._rows, self.target].all(dim=1)

    def observations(self, state: SimState) -> Obs:
        grasp = state.sensor("grasp_pos").float()
        target = self._target_pos(state)
        q = self.arm.qpos(state.qpos)
        parts = {"joint_pos": q, "joint_vel": 0.1 * self.arm.qvel(state.qvel), "grasp_pos": grasp,
                 "target_onehot": torch.nn.functional.one_hot(self.target, len(COLOURS)).float(),
                 "pad_contacts": self._contacts(state).flatten(1).float(), "last_action": self.last_action,
                 "target_rel": target - grasp,
                 "target_linvel": self._stack(state, "_linvel")[self._rows, self.target]}
        for n in self.names:
            parts[f"{n}_pos"] = state.sensor(f"{n}_pos").float()
            parts[f"{n}_quat"] = state.sensor(f"{n}_quat").float()
        critic = common.concat(parts, CRITIC_PARTS)
        return {keys.POLICY: critic[:, :-6], keys.CRITIC: critic, keys.PROPRIO: q}

    def reward_terms(self, state: SimState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        target = self._target_pos(state)
        d = torch.linalg.norm(target - state.sensor("grasp_pos").float(), dim=1)
        h, grasped = target[:, 2] - CUBE_HALF, self._grasped(state)
        # Every shaping term is <= 0 so that finishing early (success ends the episode) is never avoided.
        return {
            "reach": -d,  # m, grasp site to the named cube
            "grasp": grasped.float() - 1.0,
            "lift": -(self.cfg.lift_height - h).clamp(0.0, self.cfg.lift_height) / self.cfg.lift_height,
            "success": self._lifted(h, grasped).float(),
        }

    def _lifted(self, height: torch.Tensor, grasped: torch.Tensor) -> torch.Tensor:
        return (height >= self.cfg.lift_height) & grasped

    def success(self, state: SimState) -> torch.Tensor:
        """bool [N]: the NAMED cube is held by both pads, ``lift_height`` above its resting height."""
        return self._lifted(self._target_pos(state)[:, 2] - CUBE_HALF, self._grasped(state))

    def terminated(self, state: SimState) -> torch.Tensor:
        return (self._stack(state, "_pos")[:, :, 2] < -0.05).any(dim=1)  # a cube fell off the table

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        return {"target": self.target, "last_action": self.last_action}
