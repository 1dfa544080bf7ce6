"""humanoid_walk: track a commanded planar velocity (vx, vy, yaw rate) with a humanoid (ours by default).

The velocity-tracking recipe of legged_gym / mjlab: commands resampled during the episode, noisy proprioception
for the policy and clean privileged state for the critic, reward terms as small batched functions with their
weights in ``HumanoidWalkConfig.reward_weights``, pushes as an interval event, and a fall ends the episode.
The robot is a ``LeggedRobotDescription`` (``task.robot``): another MJCF, e.g. a Unitree G1, is a config
(configs/task/robot/g1.yaml).

World quantities are read through sensors added here with MjSpec (framepos, framequat, velocimeter, gyro,
framelinvel, geom-geom contact), so the ``mujoco`` and ``mjx`` backends serve them the same way.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import mujoco
import numpy as np
import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec
from sim.robot_description import LeggedRobotDescription
from sim.state import SimState
from sim.task import Task
from sim.tasks import humanoid_kernels as kernels


@dataclass
class HumanoidWalkConfig:
    """humanoid_walk. Velocities in the base (pelvis) frame: +x forward, +y left; angles in rad."""

    robot: LeggedRobotDescription = field(default_factory=LeggedRobotDescription)
    episode_length: int = 1000  # control steps (50 Hz with our humanoid's 5 ms timestep: 20 s)
    decimation: int = 4  # physics steps per control step
    init_joint_noise: float = 0.1  # rad, uniform noise around the home pose at reset
    init_yaw_range: float = math.pi  # rad, initial heading drawn from [-init_yaw_range, init_yaw_range]
    command_resample_s: float = 10.0  # s between command draws (the first draw of each env is staggered)
    lin_vel_x_range: list[float] = field(default_factory=lambda: [-0.5, 1.0])  # m/s
    lin_vel_y_range: list[float] = field(default_factory=lambda: [-0.3, 0.3])  # m/s
    ang_vel_z_range: list[float] = field(default_factory=lambda: [-0.8, 0.8])  # rad/s
    standing_fraction: float = 0.1  # share of draws that command standing still
    lin_vel_std: float = 0.5  # m/s, width of the linear-velocity tracking kernel
    ang_vel_std: float = 0.5  # rad/s, width of the yaw-rate tracking kernel
    air_time_threshold: float = 0.3  # s; steps with longer swings earn feet_air_time
    soft_limit_factor: float = 0.9  # joint_pos_limits starts at this fraction of each joint's range
    fall_tilt: float = 1.0  # rad, pelvis tilt beyond which the robot has fallen
    # Pushes (an interval event, as legged_gym's push_robots / Isaac Lab's push_by_setting_velocity): every
    # push_interval_s (drawn per env) a uniform [-push_velocity, push_velocity] m/s is added to the base's
    # planar velocity. 0 disables them (benchmarks/humanoid.py's result was trained without).
    push_velocity: float = 0.0  # m/s
    push_interval_s: list[float] = field(default_factory=lambda: [10.0, 15.0])  # s
    obs_noise: bool = True  # uniform noise on the policy observations (the critic's are clean)
    noise_lin_vel: float = 0.1  # m/s
    noise_ang_vel: float = 0.2  # rad/s
    noise_gravity: float = 0.05  # unit vector components
    noise_joint_pos: float = 0.01  # rad
    noise_joint_vel: float = 1.5  # rad/s
    # On the CPU the per-step math (reward terms, falls, observations, resets, commands, joint targets) runs as
    # compiled loops (sim/tasks/humanoid_kernels.py, the same numbers): ~10 us a call where ~200 torch ops took ~0.45 ms
    # at 64 envs (1.26x the env steps/s). False runs the torch reference (what MJX and Warp run).
    fused_cpu: bool = True
    terminate_on_success: bool = False  # there is no success event: episodes end by falling or by time
    # alive: with only tracking terms (<= 1) and penalties the per-step sum was ~-1 for a stumbling robot, and PPO
    # learned to dive forward and fall in 0.3 s (benchmarks/humanoid.py, first 60-min run: 6.4M steps, every
    # episode a fall) -- ending early paid. A standing bonus makes every step alive worth more than falling.
    reward_weights: dict[str, float] = field(default_factory=lambda: {
        "alive": 2.0, "track_lin_vel_xy_exp": 1.0, "track_ang_vel_z_exp": 0.5, "lin_vel_z": 1.0, "ang_vel_xy": 0.05,
        "upright": 1.0, "posture": 0.1, "action_rate": 0.01, "joint_pos_limits": 5.0, "feet_air_time": 0.5,
        "feet_slip": 0.1, "fall": 10.0,
    })


# ------------------------------------------------------------------------------------------- reward terms
# Each returns [N], signed so that a positive weight is right (penalties are <= 0).

def track_lin_vel_xy_exp(command: torch.Tensor, lin_vel_b: torch.Tensor, std: float) -> torch.Tensor:
    """exp(-|v*_xy - v_xy|² / σ²), in (0, 1]."""
    return torch.exp(-torch.sum((command[:, :2] - lin_vel_b[:, :2]) ** 2, dim=1) / std**2)


def track_ang_vel_z_exp(command: torch.Tensor, ang_vel_b: torch.Tensor, std: float) -> torch.Tensor:
    """exp(-(ω*_z - ω_z)² / σ²), in (0, 1]."""
    return torch.exp(-((command[:, 2] - ang_vel_b[:, 2]) ** 2) / std**2)


def lin_vel_z(lin_vel_b: torch.Tensor) -> torch.Tensor:
    return -lin_vel_b[:, 2] ** 2


def ang_vel_xy(ang_vel_b: torch.Tensor) -> torch.Tensor:
    return -torch.sum(ang_vel_b[:, :2] ** 2, dim=1)


def alive(fallen: torch.Tensor) -> torch.Tensor:
    """1 while standing, 0 on the step that ends in a fall."""
    return (~fallen).float()


def upright(gravity_b: torch.Tensor) -> torch.Tensor:
    """-|g_xy|² of the unit gravity vector in the base frame: 0 when the pelvis is level."""
    return -torch.sum(gravity_b[:, :2] ** 2, dim=1)


def posture(joint_pos_rel: torch.Tensor) -> torch.Tensor:
    return -torch.sum(joint_pos_rel**2, dim=1)


def action_rate(action: torch.Tensor, prev_action: torch.Tensor) -> torch.Tensor:
    return -torch.sum((action - prev_action) ** 2, dim=1)


def joint_pos_limits(q: torch.Tensor, soft_low: torch.Tensor, soft_high: torch.Tensor) -> torch.Tensor:
    """-Σ distance (rad) beyond the soft limits."""
    return -torch.sum((q - soft_high).clamp(min=0.0) + (soft_low - q).clamp(min=0.0), dim=1)


def feet_air_time(air_time: torch.Tensor, first_contact: torch.Tensor, command: torch.Tensor,
                  threshold: float) -> torch.Tensor:
    """Σ_feet (t_air - threshold) at touchdown, only while a motion is commanded (legged_gym)."""
    moving = torch.linalg.norm(command, dim=1) > 0.1
    return torch.sum((air_time - threshold) * first_contact, dim=1) * moving


def feet_slip(contact: torch.Tensor, foot_vel_xy: torch.Tensor) -> torch.Tensor:
    """-Σ_feet |v_xy|² of feet in contact. ``foot_vel_xy`` [N, feet, 2]."""
    return -torch.sum(contact * torch.sum(foot_vel_xy**2, dim=2), dim=1)


def quat_rotate_inverse(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """v [N, 3] in the world frame -> the frame of unit quaternion q [N, 4] (w, x, y, z)."""
    w, u = q[:, :1], q[:, 1:]
    return v * (2.0 * w**2 - 1.0) - 2.0 * w * torch.linalg.cross(u, v) + 2.0 * u * torch.sum(u * v, dim=1, keepdim=True)


@functools.lru_cache(maxsize=8)
def _gravity_matrix(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """M [16, 3] and offset [3] with projected_gravity(q) = flatten(q ⊗ q) @ M + offset (row-major q_i·q_j, i, j in
    w, x, y, z): g = (2(wy - xz), -2(yz + wx), 2(x² + y²) - 1). Made once per device and dtype (no copy per step)."""
    m = torch.zeros(16, 3, dtype=dtype)
    w, x, y, z = range(4)
    for (i, j), col, coef in (((w, y), 0, 2.0), ((x, z), 0, -2.0), ((y, z), 1, -2.0), ((w, x), 1, -2.0),
                              ((x, x), 2, 2.0), ((y, y), 2, 2.0)):
        m[4 * i + j, col] = coef
    return m.to(device), torch.tensor([0.0, 0.0, -1.0], dtype=dtype, device=device)


def projected_gravity(q: torch.Tensor) -> torch.Tensor:
    """World down (0, 0, -1) in the frame of unit quaternion q [N, 4] (w, x, y, z): minus the third row of q's
    rotation matrix, ``quat_rotate_inverse(q, down)`` in closed form, as an outer product contracted with a fixed
    [16, 3] matrix (4 tensor ops instead of ~17: tasks read it every step).

    The contraction is a broadcast product and a sum, not a matrix product, on purpose: with torch's default 2
    intra-op threads a BLAS call in the env's step opens torch's OpenMP pool, whose threads then spin-wait on the
    same 2 cores that MuJoCo's rollout threads step the physics on. On this machine kind that made humanoid_walk's
    step at N = 64 take 6.0-6.5 ms instead of 4.1-4.8 ms, most of it inside the physics (no difference with 1
    torch thread; ``humanoid_blas_ab_2026_12_04`` in benchmarks/results/sim_throughput.json)."""
    m, offset = _gravity_matrix(q.device, q.dtype)
    qq = (q[:, :, None] * q[:, None, :]).flatten(1)
    return torch.sum(qq[:, :, None] * m, dim=1).add_(offset)


class HumanoidWalkTask(Task):
    name = "humanoid_walk"
    instruction = "Walk at the commanded velocity."
    has_success = False  # it walks to a commanded velocity: speed and falls measure it (benchmarks/humanoid.py)
    reward_term_names = ("track_lin_vel_xy_exp", "track_ang_vel_z_exp", "lin_vel_z", "ang_vel_xy", "upright",
                         "posture", "action_rate", "joint_pos_limits", "feet_air_time", "feet_slip", "alive", "fall")

    def __init__(self, cfg: HumanoidWalkConfig) -> None:
        self.cfg = cfg
        self.robot = cfg.robot
        self.decimation = cfg.decimation
        if cfg.push_velocity < 0 or len(cfg.push_interval_s) != 2 or not 0 < cfg.push_interval_s[0] <= \
                cfg.push_interval_s[1]:
            raise ValueError(f"humanoid_walk: push_velocity must be >= 0 and push_interval_s [low, high] with "
                             f"0 < low <= high, got {cfg.push_velocity}, {cfg.push_interval_s}")
        # Sizes come from the model; read them once here so obs_spec/action_dim exist before bind().
        spec = self.build_spec()
        model = spec.compile()
        self.joint_names = self.robot.actuated_joints(model)
        self.action_dim = len(self.joint_names)
        self.num_feet = len(self.robot.feet)

    def build_spec(self) -> mujoco.MjSpec:
        spec = self.robot.load_spec()
        self.contact_geoms = self.robot.foot_contact_geoms(spec)
        site, geom = mujoco.mjtObj.mjOBJ_SITE, mujoco.mjtObj.mjOBJ_GEOM
        s = mujoco.mjtSensor
        base = self.robot.base_site_name
        spec.add_sensor(name="base_pos", type=s.mjSENS_FRAMEPOS, objtype=site, objname=base)
        spec.add_sensor(name="base_quat", type=s.mjSENS_FRAMEQUAT, objtype=site, objname=base)
        spec.add_sensor(name="base_lin_vel", type=s.mjSENS_VELOCIMETER, objtype=site, objname=base)
        spec.add_sensor(name="base_ang_vel", type=s.mjSENS_GYRO, objtype=site, objname=base)
        for i, foot_site in enumerate(self.robot.foot_site_names):
            spec.add_sensor(name=f"foot{i}_pos", type=s.mjSENS_FRAMEPOS, objtype=site, objname=foot_site)
            spec.add_sensor(name=f"foot{i}_lin_vel", type=s.mjSENS_FRAMELINVEL, objtype=site, objname=foot_site)
            for j, g in enumerate(self.contact_geoms[i]):  # geom-geom matching, "found" only: what MJX computes
                spec.add_sensor(name=f"foot{i}_contact{j}", type=s.mjSENS_CONTACT, objtype=geom, objname=g,
                                reftype=geom, refname=self.robot.floor_geom, intprm=[1, 0, 1])
        return spec

    def bind(self, model: mujoco.MjModel, num_envs: int, device: torch.device) -> None:
        if model.nu != self.action_dim:
            raise ValueError(f"humanoid_walk expects {self.action_dim} actuators, the model has {model.nu}")
        jids = model.actuator_trnid[:, 0]
        self.qpos_idx = torch.as_tensor(model.jnt_qposadr[jids], device=device)
        self.qvel_idx = torch.as_tensor(model.jnt_dofadr[jids], device=device)
        self.base_qpos_adr, self.base_dof_adr = self.robot.base_dofs(model)
        # Columns of sensordata read every step, gathered in one indexing op each: the contact sensors' "found"
        # counts (summed per foot through a [sensors, feet] 0/1 matrix) and the feet's xy velocities.
        def col(name: str) -> int:
            return int(model.sensor(name).adr[0])

        self.contact_cols = torch.as_tensor([col(f"foot{i}_contact{j}") for i, geoms in enumerate(self.contact_geoms)
                                             for j in range(len(geoms))], device=device)
        foot_of = torch.as_tensor([i for i, geoms in enumerate(self.contact_geoms) for _ in geoms])
        self.contact_to_foot = torch.nn.functional.one_hot(foot_of, self.num_feet).float().to(device)
        self.foot_vel_cols = torch.as_tensor([col(f"foot{i}_lin_vel") + k for i in range(self.num_feet)
                                              for k in range(2)], device=device)
        self.home_qpos = torch.as_tensor(self.robot.default_qpos(model), dtype=torch.float32, device=device)
        self.default_q = self.home_qpos[self.qpos_idx]
        self.action_scale = torch.as_tensor(self.robot.joint_action_scale(self.joint_names), dtype=torch.float32,
                                            device=device)
        rng = torch.as_tensor(model.jnt_range[jids], dtype=torch.float32, device=device)
        mid, half = rng.mean(dim=1), 0.5 * (rng[:, 1] - rng[:, 0])
        self.q_low, self.q_high = rng[:, 0], rng[:, 1]
        self.soft_low = mid - self.cfg.soft_limit_factor * half
        self.soft_high = mid + self.cfg.soft_limit_factor * half
        cr = torch.as_tensor(model.actuator_ctrlrange, dtype=torch.float32, device=device)
        limited = torch.as_tensor(model.actuator_ctrllimited, dtype=torch.bool, device=device)
        self.ctrl_low = torch.where(limited, cr[:, 0], torch.full_like(cr[:, 0], -torch.inf))
        self.ctrl_high = torch.where(limited, cr[:, 1], torch.full_like(cr[:, 1], torch.inf))
        self.control_dt = float(model.opt.timestep) * self.decimation
        self.resample_steps = max(1, round(self.cfg.command_resample_s / self.control_dt))
        self.push_steps = [max(1, round(t / self.control_dt)) for t in self.cfg.push_interval_s]
        n, a = num_envs, self.action_dim
        self.command = torch.zeros(n, 3, device=device)
        self.command_timer = torch.zeros(n, dtype=torch.long, device=device)
        self.push_timer = torch.zeros(n, dtype=torch.long, device=device)
        self.last_action = torch.zeros(n, a, device=device)
        self.prev_action = torch.zeros(n, a, device=device)
        self.air_time = torch.zeros(n, self.num_feet, device=device)
        self.cmd_low = torch.tensor([self.cfg.lin_vel_x_range[0], self.cfg.lin_vel_y_range[0],
                                     self.cfg.ang_vel_z_range[0]], device=device)
        self.cmd_high = torch.tensor([self.cfg.lin_vel_x_range[1], self.cfg.lin_vel_y_range[1],
                                      self.cfg.ang_vel_z_range[1]], device=device)
        self.cmd_span = self.cmd_high - self.cmd_low
        # Command, push and observation noise draws come from a generator on the env's device, re-seeded from the
        # env's generator at every reset: same seed, same noise, on every backend.
        self.rng = torch.Generator(device=device)
        self.rng.manual_seed(0)
        self.device = torch.device(device)
        c = self.cfg  # uniform noise half-widths, in the order of the policy observation
        self.noise_scale = torch.tensor([c.noise_lin_vel] * 3 + [c.noise_ang_vel] * 3 + [c.noise_gravity] * 3
                                        + [c.noise_joint_pos] * a + [c.noise_joint_vel] * a + [0.0] * (a + 3),
                                        device=device)
        self._kernel_args = self._bind_kernels(model, foot_of) if c.fused_cpu and self.device.type == "cpu" else None
        self._state_arrays: tuple[tuple[torch.Tensor, ...], tuple[np.ndarray, ...]] | None = None

    def _bind_kernels(self, model: mujoco.MjModel, foot_of: torch.Tensor) -> dict[str, np.ndarray]:
        """The constant arguments of the fused CPU kernels (numpy, made once)."""
        c = self.cfg
        params = np.zeros(6)
        params[[kernels.P_LIN_STD2, kernels.P_ANG_STD2, kernels.P_AIR_THRESHOLD, kernels.P_DT, kernels.P_FALL_HEIGHT,
                kernels.P_TILT_Z]] = [c.lin_vel_std**2, c.ang_vel_std**2, c.air_time_threshold, self.control_dt,
                                      self.robot.fall_height, -math.cos(c.fall_tilt)]
        adr = np.zeros(4, dtype=np.int64)
        for slot, name in ((kernels.A_POS, "base_pos"), (kernels.A_QUAT, "base_quat"),
                           (kernels.A_LIN_VEL, "base_lin_vel"), (kernels.A_ANG_VEL, "base_ang_vel")):
            adr[slot] = int(model.sensor(name).adr[0])
        joints = torch.stack([self.default_q, self.soft_low, self.soft_high, self.q_low, self.q_high]).numpy()
        return {"cmd_box": torch.stack([self.cmd_low, self.cmd_span]).numpy(),
                "ctrl_box": torch.stack([self.ctrl_low, self.ctrl_high]).numpy(),
                "home_qpos": self.home_qpos.numpy(), "action_scale": self.action_scale.numpy(),
                "qpos_idx": self.qpos_idx.numpy(), "qvel_idx": self.qvel_idx.numpy(), "joints": joints,
                "contact_cols": self.contact_cols.numpy(), "contact_foot": foot_of.numpy(),
                "foot_vel_cols": self.foot_vel_cols.numpy(), "adr": adr, "params": params,
                "no_noise": np.zeros((0, self.noise_scale.numel()), dtype=np.float32),
                "noise_scale": self.noise_scale.numpy(),
                # views of the task's own buffers (written in place, never replaced): one .numpy() per buffer, not
                # one per kernel call (~0.6 us each, 15 a step and 10 a reset)
                "last_action": self.last_action.numpy(), "prev_action": self.prev_action.numpy(),
                "command": self.command.numpy(), "command_timer": self.command_timer.numpy(),
                "push_timer": self.push_timer.numpy(), "air_time": self.air_time.numpy()}

    def _arrays(self, state: SimState) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Numpy views of the CPU backend's sensordata, qpos, qvel and ctrl, made once per state tensor."""
        cached = self._state_arrays
        if cached is None or any(a is not b for a, b in zip(cached[0], (state.sensordata, state.qpos, state.qvel,
                                                                          state.ctrl), strict=True)):
            tensors = (state.sensordata, state.qpos, state.qvel, state.ctrl)
            cached = self._state_arrays = (tensors, tuple(t.numpy() for t in tensors))
        return cached[1]

    def obs_parts(self) -> tuple[tuple[str, int], ...]:
        """The policy observation, part by part: base velocity (m/s) and angular velocity (rad/s) in the base
        frame, unit gravity in the base frame, joint positions relative to the home pose (rad), joint velocities
        (rad/s), the last action, the command (vx, vy m/s, yaw rate rad/s). The critic adds the base height (m)
        and the feet's floor contacts (1/0), noise-free."""
        a = self.action_dim
        return (("base_lin_vel", 3), ("base_ang_vel", 3), ("gravity", 3), ("joint_pos", a), ("joint_vel", a),
                ("last_action", a), ("command", 3))

    def obs_spec(self) -> ObsSpec:
        policy = self.obs_parts()
        return ObsSpec.from_parts({keys.POLICY: policy,
                                   keys.CRITIC: (*policy, ("base_height", 1), ("foot_contacts", self.num_feet))})

    # ------------------------------------------------------------------------------------------ resets
    def reset(self, state: SimState, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        n, dev = len(env_ids), self.device
        self.rng.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
        u = torch.rand(n, self.action_dim + 1, generator=gen).to(dev)
        if self._kernel_args is not None:  # the same draws in the same order, the writes in one compiled loop
            k, c = self._kernel_args, self.cfg
            cmd = torch.rand(n, 4, generator=self.rng)
            timer = torch.randint(1, self.resample_steps + 1, (n,), generator=self.rng)
            _, qpos, qvel, ctrl = self._arrays(state)
            kernels.reset(env_ids.numpy(), u.numpy(), cmd.numpy(), timer.numpy(), self._push_interval(n).numpy(),
                          k["home_qpos"], k["qpos_idx"], k["joints"], self.base_qpos_adr, c.init_joint_noise,
                          c.init_yaw_range, k["cmd_box"], c.standing_fraction, qpos, qvel, ctrl, k["command"],
                          k["command_timer"], k["push_timer"], k["last_action"], k["prev_action"], k["air_time"])
            return
        q = self.default_q + (u[:, :-1] * 2 - 1) * self.cfg.init_joint_noise
        q = torch.maximum(torch.minimum(q, self.q_high), self.q_low)
        yaw = (u[:, -1] * 2 - 1) * self.cfg.init_yaw_range
        qpos = self.home_qpos.expand(n, -1).clone()
        b = self.base_qpos_adr
        qpos[:, b + 3], qpos[:, b + 6] = torch.cos(yaw / 2), torch.sin(yaw / 2)  # heading about +z (w, x, y, z)
        qpos[:, self.qpos_idx] = q
        state.qpos[env_ids] = qpos.to(state.qpos.dtype)
        state.qvel[env_ids] = 0.0
        state.ctrl[env_ids] = q.to(state.ctrl.dtype)
        self._resample_commands(env_ids)
        # Staggered first resampling, so that the envs' command changes spread over time.
        self.command_timer[env_ids] = torch.randint(1, self.resample_steps + 1, (n,), generator=self.rng, device=dev)
        self.push_timer[env_ids] = self._push_interval(n)
        self.last_action[env_ids] = 0.0
        self.prev_action[env_ids] = 0.0
        self.air_time[env_ids] = 0.0

    def _draw_commands(self, n: int) -> torch.Tensor:
        """[n, 3] commands: uniform in the ranges, standing still (0) with probability ``standing_fraction``."""
        u = torch.rand(n, 4, generator=self.rng, device=self.device)
        cmd = self.cmd_low + u[:, :3] * self.cmd_span
        return torch.where(u[:, 3:] < self.cfg.standing_fraction, 0.0, cmd)

    def _resample_commands(self, env_ids: torch.Tensor) -> None:
        self.command[env_ids] = self._draw_commands(len(env_ids))

    def _push_interval(self, n: int) -> torch.Tensor:
        lo, hi = self.push_steps
        return torch.randint(lo, hi + 1, (n,), generator=self.rng, device=self.device)

    # ------------------------------------------------------------------------------------------ actions
    def action_to_ctrl(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        """Joint targets around the default pose. Also advances the command and push timers (once per control
        step) and applies the pushes that are due, to the base velocity the coming physics steps start from."""
        if self._kernel_args is not None:
            k = self._kernel_args
            target = torch.empty(state.num_envs, self.action_dim)
            kernels.commands_and_targets(action.float().contiguous().numpy(),
                                         torch.rand(state.num_envs, 4, generator=self.rng).numpy(), k["cmd_box"],
                                         self.resample_steps, self.cfg.standing_fraction, k["joints"],
                                         k["action_scale"], k["ctrl_box"], k["last_action"], k["prev_action"],
                                         k["command"], k["command_timer"], target.numpy())
            self._push(state)
            return target.to(state.ctrl.dtype)
        self.prev_action.copy_(self.last_action)
        self.last_action.copy_(action)
        self.command_timer -= 1
        due = self.command_timer <= 0
        # Drawing for every env and keeping the due ones avoids a data-dependent shape (and a GPU sync).
        self.command.copy_(torch.where(due[:, None], self._draw_commands(state.num_envs), self.command))
        self.command_timer.masked_fill_(due, self.resample_steps)
        self._push(state)
        target = self.default_q + self.action_scale * action
        target = torch.maximum(torch.minimum(target, self.ctrl_high), self.ctrl_low)
        return target.to(state.ctrl.dtype)

    def _push(self, state: SimState) -> None:
        """Count the push timers down and add a push to the base velocity of the envs whose timer ran out."""
        if self.cfg.push_velocity > 0:
            self.push_timer -= 1
            push = self.push_timer <= 0
            u = torch.rand(state.num_envs, 2, generator=self.rng, device=self.device)
            dv = (u * 2 - 1) * self.cfg.push_velocity
            v = state.qvel[:, self.base_dof_adr:self.base_dof_adr + 2]  # a free joint's linear velocity: world frame
            v.add_((dv * push[:, None]).to(v.dtype))
            self.push_timer.copy_(torch.where(push, self._push_interval(state.num_envs), self.push_timer))

    # ------------------------------------------------------------------------------------- observations
    def _base(self, state: SimState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Base linear velocity, angular velocity (base frame) and unit gravity in the base frame, [N, 3] each
        (computed once per physics step: rewards, termination and observations all read them)."""
        return state.derived("humanoid_walk.base", lambda: (
            state.sensor("base_lin_vel").float(), state.sensor("base_ang_vel").float(),
            projected_gravity(state.sensor("base_quat").float())))

    def _contact(self, state: SimState) -> torch.Tensor:
        """[N, feet] 1.0 where the foot touches the floor (any of its geoms' contact sensors found one)."""
        def compute() -> torch.Tensor:
            # counts are >= 0; a broadcast sum, not a matrix product (no BLAS in the step: see projected_gravity)
            found = torch.sum(state.sensordata[:, self.contact_cols].float()[:, :, None] * self.contact_to_foot, dim=1)
            return (found > 0).float()
        return state.derived("humanoid_walk.contact", compute)

    def observations(self, state: SimState) -> Obs:
        if self._kernel_args is not None:
            return self._fused_observations(state)
        lin_vel, ang_vel, gravity = self._base(state)
        q = state.qpos[:, self.qpos_idx].float() - self.default_q
        qd = state.qvel[:, self.qvel_idx].float()
        clean = [lin_vel, ang_vel, gravity, q, qd, self.last_action, self.command]
        policy = torch.cat(clean, dim=1)
        if self.cfg.obs_noise:
            u = torch.rand(policy.shape, generator=self.rng, device=self.device)
            policy = policy + (u * 2 - 1) * self.noise_scale
        height = state.sensor("base_pos")[:, 2:3].float()
        critic = torch.cat(clean + [height, self._contact(state)], dim=1)
        return {keys.POLICY: policy, keys.CRITIC: critic}

    def _fused_observations(self, state: SimState) -> Obs:
        k, n = self._kernel_args, state.num_envs
        width = self.noise_scale.numel()
        policy = torch.empty(n, width)
        critic = torch.empty(n, width + 1 + self.num_feet)
        # the noise is drawn as the reference draws it: same seed, same noise, fused or not
        u = torch.rand(policy.shape, generator=self.rng).numpy() if self.cfg.obs_noise else k["no_noise"]
        sens, qpos, qvel, _ = self._arrays(state)
        kernels.observations(sens, qpos, qvel, k["qpos_idx"], k["qvel_idx"], k["joints"], k["last_action"],
                             k["command"], k["contact_cols"], k["contact_foot"], k["adr"], u, k["noise_scale"],
                             policy.numpy(), critic.numpy())
        return {keys.POLICY: policy, keys.CRITIC: critic}

    # ------------------------------------------------------------------------------------------ rewards
    def reward_terms(self, state: SimState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted terms. Called once per control step after physics: it also updates the feet's air time."""
        if self._kernel_args is not None:
            return dict(zip(self.reward_term_names, self._fused_reward_matrix(state).unbind(1), strict=True))
        lin_vel, ang_vel, gravity = self._base(state)
        q = state.qpos[:, self.qpos_idx].float()
        contact = self._contact(state)
        first_contact = contact * (self.air_time > 0)
        air = feet_air_time(self.air_time, first_contact, self.command, self.cfg.air_time_threshold)
        self.air_time.add_(self.control_dt).mul_(1.0 - contact)
        foot_vel = state.sensordata[:, self.foot_vel_cols].float().view(-1, self.num_feet, 2)
        fallen = self._fallen(state)
        return {
            "track_lin_vel_xy_exp": track_lin_vel_xy_exp(self.command, lin_vel, self.cfg.lin_vel_std),
            "track_ang_vel_z_exp": track_ang_vel_z_exp(self.command, ang_vel, self.cfg.ang_vel_std),
            "lin_vel_z": lin_vel_z(lin_vel),
            "ang_vel_xy": ang_vel_xy(ang_vel),
            "upright": upright(gravity),
            "posture": posture(q - self.default_q),
            "action_rate": action_rate(self.last_action, self.prev_action),
            "joint_pos_limits": joint_pos_limits(q, self.soft_low, self.soft_high),
            "feet_air_time": air,
            "feet_slip": feet_slip(contact, foot_vel),
            "alive": alive(fallen),
            "fall": -fallen.float(),
        }

    def reward_term_matrix(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        if self._kernel_args is not None:
            return self._fused_reward_matrix(state)
        return super().reward_term_matrix(state, action)

    def _fused_reward_matrix(self, state: SimState) -> torch.Tensor:
        k, n = self._kernel_args, state.num_envs
        terms = torch.empty(n, len(self.reward_term_names))
        fallen = torch.empty(n, dtype=torch.bool)
        sens, qpos, _, _ = self._arrays(state)
        kernels.rewards(sens, qpos, k["qpos_idx"], k["joints"], k["last_action"], k["prev_action"], k["command"],
                        k["air_time"], k["contact_cols"], k["contact_foot"], k["foot_vel_cols"], k["adr"], k["params"],
                        terms.numpy(), fallen.numpy())
        state.derived("humanoid_walk.fallen", lambda: fallen)  # terminated() reads it: the same test, not redone
        return terms

    def _fallen(self, state: SimState) -> torch.Tensor:
        def compute() -> torch.Tensor:
            low = state.sensor("base_pos")[:, 2] < self.robot.fall_height
            tilted = self._base(state)[2][:, 2] > -math.cos(self.cfg.fall_tilt)
            return low | tilted
        return state.derived("humanoid_walk.fallen", compute)

    def terminated(self, state: SimState) -> torch.Tensor:
        return self._fallen(state)

    def success(self, state: SimState) -> torch.Tensor:
        return torch.zeros(state.num_envs, dtype=torch.bool, device=state.qpos.device)

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        # the generator too: between resets it draws the observation noise, commands and pushes
        return {"command": self.command, "command_timer": self.command_timer, "push_timer": self.push_timer,
                "last_action": self.last_action, "prev_action": self.prev_action, "air_time": self.air_time,
                "rng": self.rng.get_state()}

    def load_task_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        sd = dict(sd)
        rng = sd.pop("rng", None)  # absent from checkpoints written before it was saved
        if rng is not None:
            self.rng.set_state(rng)
        super().load_task_state_dict(sd)
