"""real/ee_bounds.py (RELIABILITY.md A11): EE deltas through the box, the step / rotation limits and IK on our SO-101
model, checked with an independent FK (a fresh MjData of sim/assets/so101.xml)."""

from __future__ import annotations

import itertools
import math
import time

import mujoco
import numpy as np
import pytest

from real.ee_bounds import (
    EEBounds,
    EEBoundsConfig,
    EEBoundsConfigError,
    box_distance,
    compose_swing_twist,
    quat_to_mat,
    rotation_angle,
    swing_twist,
)
from sim import ik, so101

BOX_MIN, BOX_MAX = np.array([0.10, -0.22, 0.0]), np.array([0.32, 0.22, 0.28])
HOME_DEG = np.degrees([-0.001, -0.21, 0.304, 1.477, 0.048, 0.6])  # so101_scene.xml keyframe "home"
STEP, POS_TOL = 0.05, 0.005


class FK:
    """Independent forward kinematics of the tool site: position [3] m, rotation [3, 3] of joints in degrees."""

    def __init__(self, site: str = "ee") -> None:
        self.model = mujoco.MjModel.from_xml_path(str(so101.ASSETS / "so101.xml"))
        self.data = mujoco.MjData(self.model)
        self.site = self.model.site(site).id

    def __call__(self, joints_deg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.data.qpos[:5] = np.radians(np.asarray(joints_deg)[:5])
        mujoco.mj_kinematics(self.model, self.data)
        return self.data.site_xpos[self.site].copy(), self.data.site_xmat[self.site].reshape(3, 3).copy()


@pytest.fixture(scope="module")
def fk() -> FK:
    return FK()


# ------------------------------------------------------------------------------------------------- config, math
@pytest.mark.parametrize("kw", [
    {"box_min": (0.3, -0.2, 0.0), "box_max": (0.1, 0.2, 0.3)},  # min > max
    {"box_min": (0.1, 0.2, 0.0), "box_max": (0.3, 0.2, 0.3)},  # min == max on y
    {"box_min": (0.1, math.nan, 0.0)},
    {"max_step_m": 0.0}, {"max_step_m": -0.01}, {"max_step_m": math.inf},
    {"max_rot_step_deg": 0.0}, {"max_tilt_deg": 180.0}, {"yaw_range_deg": (30.0, -30.0)},
    {"delta_rot_frame": "world"}, {"reference_quat": (0.0, 0.0, 0.0, 0.0)},
])
def test_config_refuses_unsafe_values(kw):
    with pytest.raises(EEBoundsConfigError):
        EEBoundsConfig(**kw)


def test_unknown_site_is_refused():
    with pytest.raises(EEBoundsConfigError, match="site"):
        EEBounds(EEBoundsConfig(site="nope"))


def test_swing_twist_by_hand():
    ref = quat_to_mat(ik.top_down_quat(0.0))
    for yaw in (-2.0, 0.0, 0.7, 3.0):  # top-down tools: tilt 0, yaw = the jaw heading
        tilt, y, _ = swing_twist(ref, quat_to_mat(ik.top_down_quat(yaw)))
        assert tilt == pytest.approx(0.0, abs=1e-6) and y == pytest.approx(yaw, abs=1e-6)
    # approach along +x (the arm stretched out, jaw up): 90 deg from straight down, no twist
    tilt, y, _ = swing_twist(ref, np.eye(3))  # columns: approach +x, y, jaw +z
    assert math.degrees(tilt) == pytest.approx(90.0, abs=1e-6) and y == pytest.approx(0.0, abs=1e-6)


# ------------------------------------------------------------------------------------------------- hand cases
def test_home_pose_is_inside_the_default_bounds(fk):
    b = EEBounds(EEBoundsConfig())
    p, r = fk(HOME_DEG)
    assert box_distance(p, BOX_MIN, BOX_MAX) == 0.0
    assert b.tilt_yaw(r)[0] < 30.0  # the home pose looks down at the table


def test_delta_out_of_the_box_is_clamped_to_the_face(fk):
    p0, _ = fk(HOME_DEG)
    cfg = EEBoundsConfig(box_min=tuple(BOX_MIN), box_max=(float(p0[0]) + 0.02, 0.22, 0.28))  # +x face 2 cm ahead
    b = EEBounds(cfg)
    cmd = b.command(HOME_DEG, delta=[0.04, 0.0, 0.0])  # 4 cm toward +x: 2 cm past the face
    pf, _ = fk(cmd.joints_deg)
    assert not cmd.held and cmd.clamped and b.clamps == 1
    assert pf[0] == pytest.approx(p0[0] + 0.02, abs=1e-3)  # on the face
    assert pf[1:] == pytest.approx(p0[1:], abs=1e-3)  # not moved along the face
    assert np.allclose(pf, cmd.ee_pos, atol=1e-9)


def test_20cm_delta_is_rate_limited_to_5cm_along_the_same_direction(fk):
    b = EEBounds(EEBoundsConfig())
    p0, _ = fk(HOME_DEG)
    u = np.array([0.6, 0.0, 0.8])  # up and forward: stays in the box for > 5 cm from home
    cmd = b.command(HOME_DEG, delta=0.20 * u)
    pf, _ = fk(cmd.joints_deg)
    step = pf - p0
    assert not cmd.held and cmd.rate_limited and b.rate_limits == 1
    assert np.linalg.norm(step) == pytest.approx(STEP, abs=1e-3)
    assert float(step @ u) / np.linalg.norm(step) > 0.999  # same direction
    assert cmd.joints_deg[5] == HOME_DEG[5]  # the gripper passes through


def test_rotation_step_and_tilt_are_bounded(fk):
    b = EEBounds(EEBoundsConfig(max_tilt_deg=45.0, max_rot_step_deg=10.0))
    q, tilts = HOME_DEG.copy(), []
    # keep asking to tip the tool 90 deg forward (about its own y, = world -y at home): 10 deg a tick, stops at 45
    for _ in range(8):
        cmd = b.command(q, delta=[0, 0, 0, 0.0, -math.pi / 2, 0.0])
        _, r = fk(cmd.joints_deg)
        assert not cmd.held
        assert rotation_angle(fk(q)[1], r) <= math.radians(10.0 + 2.0)
        tilts.append(b.tilt_yaw(r)[0])
        assert b.tilt_yaw(r)[0] <= 45.0 + 2.0
        q = cmd.joints_deg
    assert tilts[:4] == pytest.approx([10.0, 20.0, 30.0, 40.0], abs=1.0)  # rate-limited from ~0 deg at home
    assert tilts[-1] == pytest.approx(45.0, abs=1.0)


def test_yaw_is_clamped_into_its_range(fk):
    b = EEBounds(EEBoundsConfig(yaw_range_deg=(-20.0, 20.0), max_rot_step_deg=15.0))
    q = HOME_DEG.copy()
    for _ in range(6):  # turn the jaw 60 deg about the approach reversed (tool -x; world +z at home): stops at 20
        cmd = b.command(q, delta=[0, 0, 0, -math.radians(60.0), 0, 0])
        assert not cmd.held
        q = cmd.joints_deg
    assert b.tilt_yaw(fk(q)[1])[1] == pytest.approx(20.0, abs=2.0)
    b2 = EEBounds(EEBoundsConfig(delta_rot_frame="base"))  # about world z: yaw grows by the rotation
    c = b2.command(HOME_DEG, delta=[0, 0, 0, 0, 0, math.radians(10.0)])
    dyaw = b2.tilt_yaw(fk(c.joints_deg)[1])[1] - b2.tilt_yaw(fk(HOME_DEG)[1])[1]
    assert dyaw == pytest.approx(10.0, abs=1.5)


@pytest.mark.parametrize("bad", [
    {"delta": [math.nan, 0, 0]}, {"delta": [0, math.inf, 0]}, {"delta": [0, 0, 0, 0, -math.inf, 0]},
    {"delta": [0.01, 0.0]}, {"delta": "up"}, {"delta": None}, {"target": [0.2, 0.0]},
    {"target": [0.2, 0.0, 0.1, 0, 0, 0, 0]}, {"delta": [0, 0, 0.01], "target": [0.2, 0, 0.1]},
    {"delta": [0, 0, 0.01], "gripper_deg": math.nan}, {"delta": np.array(["a", "b", "c"])},
])
def test_malformed_inputs_are_rejected_and_held(bad):
    b = EEBounds(EEBoundsConfig())
    first = b.command(HOME_DEG, delta=[0.0, 0.0, 0.01])  # an accepted command: the hold repeats it
    cmd = b.command(HOME_DEG, **bad)
    assert cmd.rejected and cmd.held and b.rejects == 1 and cmd.reason
    assert np.array_equal(cmd.joints_deg, first.joints_deg)
    b.reset()
    cmd = b.command(HOME_DEG, **bad)  # nothing accepted since the reset: hold the present joints
    assert cmd.rejected and np.array_equal(cmd.joints_deg, HOME_DEG) and b.rejects == 2


def test_unusable_present_holds_the_last_command_or_raises():
    b = EEBounds(EEBoundsConfig())
    with pytest.raises(ValueError, match="present"):
        b.command([math.nan] * 6, delta=[0, 0, 0])
    ok = b.command(HOME_DEG, delta=[0, 0, 0.01])
    cmd = b.command([0.0, math.inf, 0, 0, 0, 0], delta=[0, 0, 0.01])
    assert cmd.rejected and np.array_equal(cmd.joints_deg, ok.joints_deg)


def test_a_start_outside_the_box_reenters_at_most_one_step_a_tick(fk):
    q = HOME_DEG.copy()
    p_home, _ = fk(HOME_DEG)
    # the box's floor 12 cm above the present tool: every tick goes up <= 5 cm, never farther out
    b = EEBounds(EEBoundsConfig(box_min=(0.10, -0.22, float(p_home[2]) + 0.12)))
    dist = [box_distance(p_home, b._lo, b._hi)]
    for _ in range(5):
        cmd = b.command(q, delta=[0.0, 0.0, 0.0])
        p, _ = fk(cmd.joints_deg)
        assert np.linalg.norm(p - fk(q)[0]) <= STEP + POS_TOL
        dist.append(box_distance(p, b._lo, b._hi))
        q = cmd.joints_deg
    assert dist[0] == pytest.approx(0.12, abs=1e-6)
    assert dist[1] == pytest.approx(0.12 - STEP, abs=2e-3)  # a full step first
    # then closer every tick (a half step when going up straight would turn the tool faster than 20 deg a tick)
    assert all(b_ <= a - 0.01 or b_ <= POS_TOL for a, b_ in itertools.pairwise(dist))
    assert dist[-1] <= POS_TOL  # inside within five ticks


# ------------------------------------------------------------------------------------------------- the fuzz
def _fuzz(n_ticks: int, seed: int, fk: FK) -> dict[str, float]:
    """Random episodes (10 ticks) from random joint configurations within the limits; the arm tracks each command
    (the next present = the command, now and then off by up to 1 deg). Deltas: tiny, small, 5-20 cm, huge, with
    and without rotations, absolute targets, NaN / inf / wrong shapes."""
    cfg = EEBoundsConfig(yaw_range_deg=(-100.0, 100.0))
    b = EEBounds(cfg)
    rng = np.random.default_rng(seed)
    max_tilt, rot_tol, max_rot = cfg.max_tilt_deg, cfg.rot_tol_deg, cfg.max_rot_step_deg
    expected_rejects, inside_ticks, inside_holds = 0, 0, 0
    q = np.zeros(6)
    t0 = time.perf_counter()
    for tick in range(n_ticks):
        if tick % 10 == 0:
            q = np.append(rng.uniform(b.joint_low_deg, b.joint_high_deg), rng.uniform(-10, 100))
        elif rng.random() < 0.2:
            q = q + np.append(rng.uniform(-1.0, 1.0, 5), 0.0)
        kind = rng.integers(10)
        kw: dict = {}
        bad = False
        if kind == 0:
            kw["delta"] = rng.normal(0, 1e-6, 3)
        elif kind == 1:
            kw["delta"] = rng.normal(0, 0.01, 3)
        elif kind == 2:
            kw["delta"] = rng.normal(0, 1.0, 3) * rng.uniform(0.05, 0.2) / math.sqrt(3)
        elif kind == 3:
            kw["delta"] = rng.normal(0, 1e3, 3)
        elif kind == 4:
            kw["delta"] = np.concatenate([rng.normal(0, 0.03, 3), rng.normal(0, 0.3, 3)])
        elif kind == 5:
            kw["delta"] = np.concatenate([rng.normal(0, 1.0, 3), rng.normal(0, 3.0, 3)])
        elif kind == 6:
            quat = rng.normal(size=4)
            kw["target"] = np.concatenate([rng.uniform(-0.5, 0.6, 3), quat]) if rng.random() < 0.5 \
                else rng.uniform(-0.5, 0.6, 3)
        elif kind == 7:
            d = rng.normal(0, 0.02, int(rng.choice([3, 6])))
            d[rng.integers(d.size)] = rng.choice([math.nan, math.inf, -math.inf])
            kw["delta"], bad = d, True
        elif kind == 8:
            kw["delta"], bad = rng.normal(0, 0.02, int(rng.choice([0, 1, 2, 4, 5, 7]))), True
        else:
            kw["delta"], kw["gripper_deg"] = rng.normal(0, 0.02, 3), float(rng.uniform(-10, 100))
        p0, r0 = fk(q)
        tilt0, yaw0 = b.tilt_yaw(r0)
        cmd = b.command(q, **kw)  # must never raise
        expected_rejects += bad
        assert cmd.rejected == bad, (tick, kw, cmd.reason)
        j = cmd.joints_deg
        assert j.shape == (6,) and np.isfinite(j).all()
        assert (j[:5] >= b.joint_low_deg - 1e-6).all() and (j[:5] <= b.joint_high_deg + 1e-6).all() or \
            np.array_equal(j, q), (tick, j)  # a hold may repeat a present that is past the margin
        p, r = fk(j)
        assert np.allclose(p, cmd.ee_pos, atol=1e-9)
        # per-tick step and rotation from the present pose
        assert np.linalg.norm(p - p0) <= STEP + POS_TOL + 1e-9, (tick, np.linalg.norm(p - p0))
        assert math.degrees(rotation_angle(r0, r)) <= max_rot + rot_tol + 1e-6, tick
        # the box: inside (+ tol) whenever the present is; no farther out (+ 1 mm IK slack) when it is not
        d0 = box_distance(p0, BOX_MIN, BOX_MAX)
        if d0 <= POS_TOL:
            inside_ticks += 1
            inside_holds += cmd.held and not bad
            assert box_distance(p, BOX_MIN, BOX_MAX) <= POS_TOL + 1e-9, (tick, p, kw)
        else:
            assert box_distance(p, BOX_MIN, BOX_MAX) <= d0 + 1e-3 + 1e-9, (tick, p, kw)
        # orientation: within the tilt / yaw bounds (+ tol) whenever the present is; no worse (+ 0.5 deg) otherwise
        tilt, yaw = b.tilt_yaw(r)
        assert tilt <= max(max_tilt + rot_tol, tilt0 + 0.5) + 1e-6, (tick, tilt, tilt0)
        if tilt <= max_tilt + rot_tol:
            excess0 = max(0.0, abs(yaw0) - 100.0)
            assert max(0.0, abs(yaw) - 100.0) <= max(rot_tol, excess0 + 0.5) + 1e-6, (tick, yaw, yaw0)
        if not bad and "gripper_deg" in kw and not cmd.held:
            assert j[5] == kw["gripper_deg"]
        q = j
    assert b.rejects == expected_rejects and b.ticks == n_ticks
    assert inside_ticks >= 0.3 * n_ticks  # the box property was exercised, not only re-entry
    assert inside_holds <= 0.05 * inside_ticks, (inside_holds, inside_ticks)  # IK rarely gives up inside the box
    return {"s": time.perf_counter() - t0, "holds": b.holds, "inside": inside_ticks}


def test_fuzz_1000_ee_deltas(fk):
    """The CI tier of A11 (1,000 ticks, ~5-8 s on a loaded 2-core machine); 10,000 run under ``-m slow``."""
    _fuzz(1000, seed=0, fk=fk)


@pytest.mark.slow
def test_fuzz_10000_ee_deltas(fk):
    _fuzz(10_000, seed=1, fk=fk)


def test_reexported_from_the_safety_module():
    """real.safety is where a user looks for limits: the EE bounds are there too (the same classes)."""
    import real.ee_bounds
    import real.safety

    assert real.safety.EEBounds is real.ee_bounds.EEBounds
    assert real.safety.EEBoundsConfig is real.ee_bounds.EEBoundsConfig
    with pytest.raises(AttributeError):
        real.safety.NoSuchLimit  # noqa: B018


def test_yaw_and_tilt_bounds_by_hand():
    """The yaw bound around the circle and the nearest orientation within the bounds, on hand-picked angles."""
    r = math.radians
    b = EEBounds(EEBoundsConfig(yaw_range_deg=(-30.0, 30.0), max_tilt_deg=60.0))
    for yaw, excess in ((0.0, 0.0), (30.0, 0.0), (-30.0, 0.0), (40.0, 10.0), (-50.0, 20.0), (170.0, 140.0),
                        (-170.0, 140.0), (200.0, 130.0)):  # 200 deg is -160: 130 past -30, 170 past +30
        assert b.yaw_excess(r(yaw)) == pytest.approx(r(excess), abs=1e-12), yaw
    assert EEBounds(EEBoundsConfig()).yaw_excess(r(179.0)) == 0.0  # the default range is the whole circle
    axis = np.array([0.0, 1.0, 0.0])
    for tilt, yaw, bounded in ((20.0, 10.0, (20.0, 10.0)), (75.0, 10.0, (60.0, 10.0)), (20.0, 50.0, (20.0, 30.0)),
                               (20.0, 200.0, (20.0, -30.0)), (80.0, -45.0, (60.0, -30.0))):
        rot = compose_swing_twist(quat_to_mat(np.asarray(b.cfg.reference_quat)), r(tilt), r(yaw), axis)
        out = b.bound_orientation(rot)
        assert b.tilt_yaw(out) == pytest.approx(bounded, abs=1e-6), (tilt, yaw)
        if bounded == (tilt, yaw):
            assert out is rot  # inside the bounds: left as it is


def test_verification_step_at_its_tolerances_by_hand():
    """The check on FK of every command (step 5 of the module docstring), at each tolerance: just inside passes, just
    outside names the check that failed in mm / degrees. Binary-exact lengths so a bound is hit exactly."""
    r = math.radians
    cfg = EEBoundsConfig(max_step_m=0.0625, pos_tol_m=0.0078125, yaw_range_deg=(-30.0, 30.0), max_tilt_deg=60.0,
                         max_rot_step_deg=20.0, rot_tol_deg=2.0)
    b = EEBounds(cfg)
    ref, axis = quat_to_mat(np.asarray(cfg.reference_quat)), np.array([0.0, 1.0, 0.0])

    def rot(tilt: float, yaw: float) -> np.ndarray:
        return compose_swing_twist(ref, r(tilt), r(yaw), axis)

    p0, r0 = np.array([0.25, 0.0, 0.125]), rot(0.0, 0.0)
    assert b._check(p0, r0, p0.copy(), r0.copy()) == ""
    # the step: exactly max_step_m + pos_tol_m (0.0703125 m) passes, 0.1 mm more does not
    assert b._check(p0, r0, p0 + [0.0, 0.0, 0.0703125], r0) == ""
    assert b._check(p0, r0, p0 + [0.0, 0.0, 0.0705], r0) == "step 70.5 mm"
    # the box: pos_tol_m outside it passes, 1 mm farther does not (BOX_MAX z = 0.28)
    top = np.array([0.25, 0.0, 0.28])
    assert b._check(top, r0, top + [0.0, 0.0, 0.0078125], r0) == ""
    assert b._check(top, r0, top + [0.0, 0.0, 0.0088125], r0) == "8.8 mm outside the box"
    # a present 20 mm outside: a command may lie up to 20 + 1 mm (REENTRY_SLACK_M) outside, not farther
    out = np.array([0.25, 0.0, 0.30])
    assert b._check(out, r0, out + [0.0, 0.0, 0.0009], r0) == ""
    assert b._check(out, r0, out + [0.0, 0.0, 0.0011], r0) == "21.1 mm outside the box"
    # non-finite FK
    assert b._check(p0, r0, p0 + [math.nan, 0.0, 0.0], r0) == "non-finite FK"
    assert b._check(p0, r0, p0, np.where(np.eye(3) > 0, math.inf, r0)) == "non-finite FK"
    # the tilt: the bound + rot_tol (62 deg) passes, beyond it does not; a present tilted past it may stay at most
    # 0.5 deg (REENTRY_SLACK_RAD) farther out
    assert b._check(p0, rot(50.0, 0.0), p0, rot(61.9, 0.0)) == ""
    assert b._check(p0, rot(50.0, 0.0), p0, rot(62.1, 0.0)) == "tilt 62.1 deg"
    assert b._check(p0, rot(70.0, 0.0), p0, rot(70.4, 0.0)) == ""
    assert b._check(p0, rot(70.0, 0.0), p0, rot(70.6, 0.0)) == "tilt 70.6 deg"
    # the yaw likewise: rot_tol past the range passes, beyond it does not, a present past it + 0.5 deg
    assert b._check(p0, rot(0.0, 25.0), p0, rot(0.0, 31.9)) == ""
    assert b._check(p0, rot(0.0, 25.0), p0, rot(0.0, 32.1)) == "yaw 32.1 deg"
    assert b._check(p0, rot(0.0, -40.0), p0, rot(0.0, -40.4)) == ""
    assert b._check(p0, rot(0.0, -40.0), p0, rot(0.0, -40.6)) == "yaw -40.6 deg"
    # ... and only within the tilt bound + rot_tol (62 deg): re-entering from 80 deg of tilt, a yaw 5 deg past the
    # range is not refused; at 61 deg it is
    assert b._check(p0, rot(80.0, 28.0), p0, rot(79.0, 35.0)) == ""
    assert b._check(p0, rot(61.0, 28.0), p0, rot(61.0, 35.0)) == "yaw 35.0 deg"
    # the rotation step: max_rot_step_deg + rot_tol (22 deg) passes, beyond it does not
    assert b._check(p0, r0, p0, rot(0.0, 21.9)) == ""
    assert b._check(p0, r0, p0, rot(0.0, 22.1)) == "rotation step 22.1 deg"
