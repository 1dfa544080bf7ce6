"""The SO-101 MJCF against shared/SO101.md: names, masses, hand-computed forward kinematics, IK reach, a real grasp."""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest

from sim.ik import TOP_DOWN, nearest_grasp_yaw, solve_ik, top_down_quat

ASSETS = Path(__file__).resolve().parents[2] / "sim" / "assets"
JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")  # LeRobot order
ARM = JOINTS[:5]
PAN_AXIS_XY = np.array([0.0388353, 0.0])  # shoulder_pan axis in the base frame (SO101.md)
OPEN, CLOSED = 1.0, 0.0  # gripper joint [rad]: 0 closed, larger open

# SO101.md: (body, pos, quat w x y z) of each joint-carrying body relative to its parent, base -> moving_jaw.
CHAIN = (
    ("shoulder", (0.0388353, -8.97657e-09, 0.0624), (3.56167e-16, 1.22818e-15, -1, -4.14635e-16)),
    ("upper_arm", (-0.0303992, -0.0182778, -0.0542), (0.5, -0.5, -0.5, -0.5)),
    ("lower_arm", (-0.11257, -0.028, 0), (0.707107, 0, 0, 0.707107)),
    ("wrist", (-0.1349, 0.0052, 0), (0.707107, 0, 0, -0.707107)),
    ("gripper", (0, -0.0611, 0.0181), (0.0172091, -0.0172091, 0.706897, 0.706897)),
    ("moving_jaw", (0.0202, 0.0188, -0.0234), (0.707107, 0.707107, 0, 0)),
)
GRIPPERFRAME_POS = (-0.0079, -0.000218121, -0.0981274)  # "ee" site in the gripper body
MASSES = {
    "base": 0.147,
    "shoulder": 0.100006,
    "upper_arm": 0.103,
    "lower_arm": 0.104,
    "wrist": 0.079,
    "gripper": 0.087,
    "moving_jaw": 0.012,
}


@pytest.fixture(scope="module")
def arm_model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(ASSETS / "so101.xml"))


@pytest.fixture(scope="module")
def scene() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(ASSETS / "so101_scene.xml"))


def _quat_to_mat(q: tuple[float, ...]) -> np.ndarray:
    w, x, y, z = np.asarray(q, dtype=float) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def _rot_z(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _hand_fk_ee(q: np.ndarray) -> np.ndarray:
    """World position of the tool frame: p_i = p_{i-1} + R_{i-1} t_i, R_i = R_{i-1} R(quat_i) Rz(q_i)."""
    pos, rot = np.zeros(3), np.eye(3)
    for (name, t, quat), angle in zip(CHAIN[:5], q[:5], strict=True):
        pos = pos + rot @ np.asarray(t)
        rot = rot @ _quat_to_mat(quat) @ _rot_z(angle)
        if name == "gripper":
            return pos + rot @ np.asarray(GRIPPERFRAME_POS)
    raise AssertionError("chain has no gripper body")


def _ids(model: mujoco.MjModel, names: tuple[str, ...]) -> list[int]:
    return [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in names]


def test_compiles_with_lerobot_names_and_masses(arm_model: mujoco.MjModel, scene: mujoco.MjModel) -> None:
    for model in (arm_model, scene):
        hinges = [model.joint(i).name for i in range(model.njnt) if model.jnt_type[i] == mujoco.mjtJoint.mjJNT_HINGE]
        assert tuple(hinges) == JOINTS
        assert tuple(model.actuator(i).name for i in range(model.nu)) == JOINTS
        for name, mass in MASSES.items():
            assert model.body(name).mass[0] == pytest.approx(mass, rel=1e-6)
        assert np.allclose(model.actuator_gainprm[:, 0], 998.22)
        assert np.allclose(model.actuator_biasprm[:, 2], -2.731)
        assert np.allclose(model.actuator_forcerange, [-3.35, 3.35])
    assert scene.nq == 6 + 7 and scene.nu == 6
    for site in ("ee", "grasp", "base", "target", "goal", "cube"):
        assert mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_SITE, site) >= 0, site
    for cam in ("front", "wrist"):
        assert mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_CAMERA, cam) >= 0, cam


def test_forward_kinematics_matches_hand_composition(arm_model: mujoco.MjModel) -> None:
    data = mujoco.MjData(arm_model)
    rng = np.random.default_rng(0)
    lo, hi = arm_model.jnt_range[:, 0], arm_model.jnt_range[:, 1]
    for _ in range(10):
        q = rng.uniform(lo, hi)
        data.qpos[:] = q
        mujoco.mj_kinematics(arm_model, data)
        np.testing.assert_allclose(data.site("ee").xpos, _hand_fk_ee(q), atol=1e-6)


def test_ik_reaches_table_points_top_down(scene: mujoco.MjModel) -> None:
    data = mujoco.MjData(scene)
    mujoco.mj_resetDataKeyframe(scene, data, scene.key("home").id)
    qpos_before = data.qpos.copy()
    arm = _ids(scene, ARM)
    rng = np.random.default_rng(1)
    lo, hi = scene.jnt_range[arm, 0], scene.jnt_range[arm, 1]
    check = mujoco.MjData(scene)
    for _ in range(10):
        radius, azimuth = rng.uniform(0.12, 0.24), rng.uniform(-1.2, 1.2)  # from the pan axis [m], [rad]
        target = np.r_[PAN_AXIS_XY + radius * np.array([np.cos(azimuth), np.sin(azimuth)]), rng.uniform(0.0125, 0.05)]
        q_init = data.qpos[:5] + np.array([azimuth, 0, 0, 0, 0])
        q = solve_ik(scene, data, "grasp", target, q_init, arm, target_quat_or_axis=TOP_DOWN)
        assert np.all(q >= lo) and np.all(q <= hi)
        check.qpos[:5] = q
        mujoco.mj_kinematics(scene, check)
        assert np.linalg.norm(check.site("grasp").xpos - target) < 5e-3, target
        approach = check.site("grasp").xmat.reshape(3, 3)[:, 0]
        assert approach @ TOP_DOWN > np.cos(np.radians(1.0))
    np.testing.assert_array_equal(data.qpos, qpos_before)  # the caller's data is untouched


def test_ik_with_a_reused_scratch_gives_the_fresh_solvers_answer(scene: mujoco.MjModel) -> None:
    """A caller's scratch MjData, left by earlier solves and filled with junk besides, changes no answer: the solver
    overwrites what kinematics reads (qpos, mocap poses) and nothing else carries over."""
    data = mujoco.MjData(scene)
    mujoco.mj_resetDataKeyframe(scene, data, scene.key("home").id)
    arm = _ids(scene, ARM)
    scratch = mujoco.MjData(scene)
    scratch.qvel[:], scratch.qacc[:], scratch.ctrl[:] = 3.0, -7.0, 0.5
    rng = np.random.default_rng(2)
    for _ in range(6):
        target = np.r_[PAN_AXIS_XY + rng.uniform(0.1, 0.2, 2) * [1, rng.choice([-1, 1])], rng.uniform(0.02, 0.1)]
        kw = {"target_quat_or_axis": TOP_DOWN, "iters": 30}
        fresh = solve_ik(scene, data, "grasp", target, data.qpos[:5], arm, **kw)
        reused = solve_ik(scene, data, "grasp", target, data.qpos[:5], arm, scratch=scratch, **kw)
        np.testing.assert_array_equal(reused, fresh)
        data.qpos[:5] = fresh  # the next solve starts elsewhere, as an expert's next step does


def test_ik_full_top_down_orientation_and_limits(scene: mujoco.MjModel) -> None:
    data = mujoco.MjData(scene)
    mujoco.mj_resetDataKeyframe(scene, data, scene.key("home").id)
    arm = _ids(scene, ARM)
    yaw = 0.3
    q = solve_ik(scene, data, "grasp", [0.22, 0.05, 0.03], data.qpos[:5], arm, target_quat_or_axis=top_down_quat(yaw))
    data.qpos[:5] = q
    mujoco.mj_kinematics(scene, data)
    xmat = data.site("grasp").xmat.reshape(3, 3)
    np.testing.assert_allclose(xmat[:, 0], TOP_DOWN, atol=1e-3)
    np.testing.assert_allclose(xmat[:, 2], [np.cos(yaw), np.sin(yaw), 0.0], atol=1e-3)
    far = solve_ik(scene, data, "grasp", [1.0, 0.0, 0.5], q, arm)  # unreachable: best effort within the ranges
    assert np.all(far >= scene.jnt_range[arm, 0]) and np.all(far <= scene.jnt_range[arm, 1])


def _step(model: mujoco.MjModel, data: mujoco.MjData, seconds: float) -> None:
    for _ in range(round(seconds / model.opt.timestep)):
        mujoco.mj_step(model, data)


def _move_grasp_site(
    model: mujoco.MjModel,
    data: mujoco.MjData,
    target: np.ndarray,
    yaw: float,
    gripper: float,
    seconds: float,
    waypoints: int = 10,
) -> None:
    """Straight-line Cartesian move of the "grasp" site, top-down, by IK on waypoints and position control."""
    arm = _ids(model, ARM)
    start, q = data.site("grasp").xpos.copy(), data.qpos[:5].copy()
    for s in np.linspace(0.0, 1.0, waypoints + 1)[1:]:
        q = solve_ik(model, data, "grasp", start + s * (target - start), q, arm, target_quat_or_axis=top_down_quat(yaw))
        data.ctrl[:5], data.ctrl[5] = q, gripper
        _step(model, data, seconds / waypoints)


@pytest.mark.parametrize("cube_xy", [(0.2, 0.0), (0.15, 0.1), (0.25, -0.08), (0.18, -0.15), (0.24, 0.12)])
def test_top_down_grasp_lifts_cube(scene: mujoco.MjModel, cube_xy: tuple[float, float]) -> None:
    data = mujoco.MjData(scene)
    mujoco.mj_resetDataKeyframe(scene, data, scene.key("home").id)
    cube_adr = scene.joint("cube").qposadr[0]
    data.qpos[cube_adr : cube_adr + 2] = cube_xy
    mujoco.mj_forward(scene, data)
    cube0 = data.qpos[cube_adr : cube_adr + 3].copy()
    yaw = nearest_grasp_yaw(0.0, float(np.arctan2(cube_xy[1], cube_xy[0] - PAN_AXIS_XY[0])))

    _move_grasp_site(scene, data, cube0 + [0, 0, 0.06], yaw, OPEN, 1.0, waypoints=5)  # above the cube
    _move_grasp_site(scene, data, cube0, yaw, OPEN, 1.0)  # descend around it
    data.ctrl[5] = CLOSED
    _step(scene, data, 0.6)
    _move_grasp_site(scene, data, cube0 + [0, 0, 0.05], yaw, CLOSED, 1.0)  # lift 5 cm
    _step(scene, data, 2.0)  # hold

    cube1 = data.qpos[cube_adr : cube_adr + 3]
    assert cube1[2] - cube0[2] >= 0.045, f"cube lifted only {cube1[2] - cube0[2]:.4f} m"
    # still between the pads: in the grasp frame (x approach, z jaw opening) within the pads' extent
    grasp = data.site("grasp")
    rel = grasp.xmat.reshape(3, 3).T @ (cube1 - grasp.xpos)
    assert np.all(np.abs(rel) < [0.008, 0.008, 0.006]), rel
    assert 0.2 < data.qpos[5] < 0.45  # the jaw is stopped by the cube, not closed


def test_home_keyframe_is_at_rest(scene: mujoco.MjModel) -> None:
    data = mujoco.MjData(scene)
    mujoco.mj_resetDataKeyframe(scene, data, scene.key("home").id)
    np.testing.assert_allclose(data.ctrl, data.qpos[:6])
    q0 = data.qpos.copy()
    _step(scene, data, 1.0)
    assert np.abs(data.qvel).max() < 1e-3
    assert np.abs(data.qpos[:6] - q0[:6]).max() < 2e-3
    assert np.linalg.norm(data.qpos[6:9] - q0[6:9]) < 1e-3  # the cube stays put on the table
    arm_bodies = {scene.body(n).id for n in MASSES}
    for contact in data.contact[: data.ncon]:
        bodies = {scene.geom_bodyid[contact.geom1], scene.geom_bodyid[contact.geom2]}
        assert not bodies <= arm_bodies, "self-collision at home"


def test_reach_drops_the_scene_cube_and_the_arm_moves_the_same() -> None:
    """so101_reach simulates no cube by default (it never reads one); with or without it, the same seed and actions
    give the same arm (float rounding apart: the cube only joined the constraint solve)."""
    import torch

    from sim.config import SimConfig
    from sim.registry import make_env
    from sim.tasks.so101_reach import ReachConfig

    scene = mujoco.MjModel.from_xml_path(str(ASSETS / "so101_scene.xml"))
    envs = [make_env("so101_reach", SimConfig(num_envs=8, seed=0), cfg) for cfg in (ReachConfig(),
                                                                                  ReachConfig(scene_cube=True))]
    bare, with_cube = (e.physics.model for e in envs)
    assert mujoco.mj_name2id(bare, mujoco.mjtObj.mjOBJ_BODY, "cube") == -1 and bare.nq == 6
    assert mujoco.mj_name2id(with_cube, mujoco.mjtObj.mjOBJ_BODY, "cube") >= 0 and with_cube.nq == scene.nq
    np.testing.assert_array_equal(bare.key_qpos[0], scene.key_qpos[0, :6])  # the home pose survives the removal
    obs = [e.reset(seed=3)[0]["policy"] for e in envs]
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        action = torch.rand(8, 6, generator=g) * 2 - 1
        obs = [e.step(action)[0]["policy"] for e in envs]
        torch.testing.assert_close(obs[0], obs[1], rtol=0, atol=1e-5)
    for e in envs:
        e.close()
