"""Pieces the SO-101 tasks share: the scene with the sensors they read, the home pose, arm resets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mujoco
import torch

from sim import so101
from sim.state import SimState
from sim.task import Task

CAMERAS = ("front", "wrist")


@dataclass
class ArmTaskConfig:
    """What every SO-101 task config holds: episode length, control rate and the action mapping (``SO101Arm``).
    A task's own config derives from it and adds (or re-declares, with its own default) fields."""

    episode_length: int = 150  # control steps (30 Hz: 5 s)
    decimation: int = 10  # physics steps per control step (timestep 1/300 s -> 30 Hz control)
    action_mode: str = "delta"  # "delta" (joint targets relative to the measured position) or "absolute"
    max_delta: float = 0.08  # rad per control step for arm joints at |a| = 1
    max_delta_gripper: float = 0.15  # rad per control step for the gripper at |a| = 1
    init_joint_noise: float = 0.05  # rad, uniform noise around the home pose at reset
    terminate_on_success: bool = True  # end an episode on its success step
    cameras: list[str] = field(default_factory=list)  # e.g. ["front", "wrist"] to add image observations
    image_width: int = 128  # px
    image_height: int = 128  # px
PROPRIO_PARTS = (("joint_pos", 6),)  # rad, LeRobot's joint order: what a real SO-101 reports about itself


class ArmTask(Task):
    """An SO-101 task: six joint targets per action, images from the config's cameras (of ``CAMERAS``)."""

    def __init__(self, cfg: ArmTaskConfig) -> None:
        validate_cameras(cfg.cameras)
        self.cfg = cfg
        self.decimation = cfg.decimation
        self.action_dim = 6

    def cameras(self) -> list[str]:
        return list(self.cfg.cameras)


def concat(values: dict[str, torch.Tensor], layout: Sequence[tuple[str, int]]) -> torch.Tensor:
    """[N, sum of sizes] the named [N, size] tensors side by side in ``layout``'s order, the order that
    ``ObsSpec.from_parts`` names: one list decides both the observation and the names of its slices."""
    return torch.cat([values[name] for name, _ in layout], dim=1)


def validate_cameras(cameras: list[str]) -> None:
    bad = [c for c in cameras if c not in CAMERAS]
    if bad:
        raise ValueError(f"unknown camera(s) {bad}; the SO-101 scene has {list(CAMERAS)}")


# The scene's visual-only markers (mocap sites, no physics), by the task element they show.
MARKER_SITES = {"target": ("target", "target_pole"), "goal": ("goal",)}


def scene_spec(sites: tuple[str, ...] = (), bodies: tuple[str, ...] = (), quats: tuple[str, ...] = (),
               linvel_bodies: tuple[str, ...] = (), markers: tuple[str, ...] = ()) -> mujoco.MjSpec:
    """The SO-101 table scene with a ``framepos`` sensor ``<name>_pos`` per site/body the task reads.

    Tasks read world poses through sensors so every backend serves them the same way (``SimState.sensor``).
    ``markers`` names the visual markers the task shows (``MARKER_SITES``: the reach target, the push goal); the
    others are made fully transparent, so a camera never sees a marker that means nothing in this task.
    """
    unknown = set(markers) - set(MARKER_SITES)
    if unknown:
        raise ValueError(f"unknown scene markers {sorted(unknown)}; known: {sorted(MARKER_SITES)}")
    spec = mujoco.MjSpec.from_file(str(so101.SCENE_XML))
    for marker, names in MARKER_SITES.items():
        if marker not in markers:
            for name in names:
                site = spec.site(name)
                site.rgba = [*list(site.rgba)[:3], 0.0]
    for s in sites:
        spec.add_sensor(name=f"{s}_pos", type=mujoco.mjtSensor.mjSENS_FRAMEPOS, objtype=mujoco.mjtObj.mjOBJ_SITE,
                        objname=s)
    for b in bodies:
        spec.add_sensor(name=f"{b}_pos", type=mujoco.mjtSensor.mjSENS_FRAMEPOS, objtype=mujoco.mjtObj.mjOBJ_BODY,
                        objname=b)
    for b in quats:
        spec.add_sensor(name=f"{b}_quat", type=mujoco.mjtSensor.mjSENS_FRAMEQUAT, objtype=mujoco.mjtObj.mjOBJ_BODY,
                        objname=b)
    for b in linvel_bodies:
        spec.add_sensor(name=f"{b}_linvel", type=mujoco.mjtSensor.mjSENS_FRAMELINVEL,
                        objtype=mujoco.mjtObj.mjOBJ_BODY, objname=b)
    return spec


@dataclass
class HomeState:
    qpos: torch.Tensor  # [nq], float64
    ctrl: torch.Tensor  # [nu], float64


def home_state(model: mujoco.MjModel, device: torch.device) -> HomeState:
    """The ``home`` keyframe (arm at rest, cube on the table), or qpos0 when the model has none."""
    kid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, "home")
    if kid >= 0:
        return HomeState(torch.as_tensor(model.key_qpos[kid].copy(), device=device),
                         torch.as_tensor(model.key_ctrl[kid].copy(), device=device))
    return HomeState(torch.as_tensor(model.qpos0.copy(), device=device),
                     torch.zeros(model.nu, dtype=torch.float64, device=device))


def reset_arm(state: SimState, arm: so101.SO101Arm, home: HomeState, env_ids: torch.Tensor, gen: torch.Generator,
              noise: float) -> None:
    """Home pose plus uniform joint noise (rad) on the five arm joints; velocities zero; targets = positions."""
    n = len(env_ids)
    qpos = home.qpos.to(state.qpos.dtype).expand(n, -1).clone()
    eps = (torch.rand(n, 5, generator=gen, dtype=torch.float64) * 2 - 1) * noise
    idx = arm.qpos_idx[:5]
    q = (qpos[:, idx] + eps.to(qpos.device)).clamp(arm.low[:5].double(), arm.high[:5].double())
    qpos[:, idx] = q.to(qpos.dtype)
    state.qpos[env_ids] = qpos
    state.qvel[env_ids] = 0.0
    ctrl = home.ctrl.to(state.ctrl.dtype).expand(n, -1).clone()
    ctrl[:, arm.act_idx[:5]] = q.to(ctrl.dtype)
    state.ctrl[env_ids] = ctrl


def add_pad_contacts(spec: mujoco.MjSpec, geom: str, suffix: str = "") -> None:
    """Contact sensors ``fixed_pad_contact<suffix>``/``moving_pad_contact<suffix>``: number of contacts of each pad
    with ``geom`` (a suffix tells apart the sensors of several objects)."""
    for pad in ("fixed_pad", "moving_pad"):
        spec.add_sensor(name=f"{pad}_contact{suffix}", type=mujoco.mjtSensor.mjSENS_CONTACT, objtype=mujoco.mjtObj.mjOBJ_GEOM,
                        objname=pad, reftype=mujoco.mjtObj.mjOBJ_GEOM, refname=geom, intprm=[1, 0, 1])


def place_cube(state: SimState, env_ids: torch.Tensor, gen: torch.Generator, qadr: int, dadr: int,
               low: torch.Tensor, high: torch.Tensor, max_yaw: float, half: float = 0.0125) -> torch.Tensor:
    """Put the cube flat on the table at a uniform xy in [low, high] with yaw in [-max_yaw, max_yaw]; returns xy."""
    n = len(env_ids)
    u = torch.rand(n, 3, generator=gen, dtype=torch.float64).to(state.qpos.device)
    xy = low.double() + u[:, :2] * (high - low).double()
    yaw = (u[:, 2] * 2 - 1) * max_yaw
    q = torch.zeros(n, 7, dtype=state.qpos.dtype, device=state.qpos.device)
    q[:, :2], q[:, 2] = xy, half
    q[:, 3], q[:, 6] = torch.cos(yaw / 2), torch.sin(yaw / 2)  # quaternion w x y z about +z
    state.qpos[env_ids, qadr:qadr + 7] = q
    state.qvel[env_ids, dadr:dadr + 6] = 0.0
    return xy.float()


def add_cube(spec: mujoco.MjSpec, name: str, rgba: Sequence[float], pos: Sequence[float], half: float = 0.0125,
             mass: float = 0.03) -> None:
    """A free cube (body, free joint and box geom all called ``name``) like the scene's own: side ``2 * half`` m,
    ``mass`` kg, the scene cube's friction, resting at ``pos`` (m, world frame)."""
    body = spec.worldbody.add_body(name=name, pos=list(pos))
    body.add_freejoint(name=name)
    body.add_geom(name=name, type=mujoco.mjtGeom.mjGEOM_BOX, size=[half] * 3, mass=mass, friction=[1.5, 0.01, 0.001],
                  condim=4, rgba=list(rgba))


def sample_apart(num: int, count: int, gen: torch.Generator, low: torch.Tensor, high: torch.Tensor,
                 min_distance: float, max_rounds: int = 100) -> torch.Tensor:
    """float64 [num, count, 2]: ``count`` points per row, uniform in the box [low, high] (m), every pair at least
    ``min_distance`` apart. Rejection sampling of whole rows, 16 candidates per row and round, drawn from ``gen``
    alone (a seed reproduces them).

    Raises:
        ValueError: when no row was found in ``max_rounds`` rounds (the box is too small for that many points).
    """
    low, high = low.double().cpu(), high.double().cpu()
    out = torch.zeros(num, count, 2, dtype=torch.float64)
    todo = torch.arange(num)
    pairs = torch.triu_indices(count, count, offset=1)
    for _ in range(max_rounds):
        if todo.numel() == 0:
            return out
        cand = low + torch.rand(len(todo), 16, count, 2, generator=gen, dtype=torch.float64) * (high - low)
        gaps = torch.linalg.norm(cand[:, :, pairs[0]] - cand[:, :, pairs[1]], dim=-1)  # [K, 16, pairs]
        ok = (gaps >= min_distance).all(dim=-1)  # [K, 16]
        found = ok.any(dim=1)
        first = ok.float().argmax(dim=1)  # the first valid candidate of each row
        rows = found.nonzero().flatten()
        out[todo[rows]] = cand[rows, first[rows]]
        todo = todo[~found]
    raise ValueError(f"could not place {count} objects {min_distance} m apart in the box {low.tolist()} to "
                     f"{high.tolist()} after {max_rounds} rounds: widen the box or lower the distance")


def place_cubes(state: SimState, env_ids: torch.Tensor, gen: torch.Generator, qadrs: Sequence[int],
                dadrs: Sequence[int], low: torch.Tensor, high: torch.Tensor, max_yaw: float, min_distance: float,
                half: float = 0.0125) -> torch.Tensor:
    """Put several cubes flat on the table at uniform xy in [low, high], pairwise at least ``min_distance`` m apart,
    each with a yaw in [-max_yaw, max_yaw] rad; returns their xy, float32 [len(env_ids), cubes, 2]."""
    n, k = len(env_ids), len(qadrs)
    xy = sample_apart(n, k, gen, low, high, min_distance)
    yaw = (torch.rand(n, k, generator=gen, dtype=torch.float64) * 2 - 1) * max_yaw
    dev, dt = state.qpos.device, state.qpos.dtype
    for j, (qadr, dadr) in enumerate(zip(qadrs, dadrs)):
        q = torch.zeros(n, 7, dtype=torch.float64)
        q[:, :2], q[:, 2] = xy[:, j], half
        q[:, 3], q[:, 6] = torch.cos(yaw[:, j] / 2), torch.sin(yaw[:, j] / 2)  # quaternion w x y z about +z
        state.qpos[env_ids, qadr:qadr + 7] = q.to(dev, dt)
        state.qvel[env_ids, dadr:dadr + 6] = 0.0
    return xy.float().to(dev)
