"""The SO-101 action mapping (``sim.so101.SO101Arm``) in each action mode, against numbers worked by hand."""

from __future__ import annotations

import mujoco
import pytest
import torch

from sim import so101


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(so101.SCENE_XML))


def _arm(model: mujoco.MjModel, mode: str) -> so101.SO101Arm:
    return so101.SO101Arm(model, torch.device("cpu"), max_delta=0.08, max_delta_gripper=0.15, action_mode=mode)


def _targets(arm: so101.SO101Arm, q: list[list[float]], a: list[list[float]]) -> torch.Tensor:
    qpos = torch.zeros(len(q), int(arm.qpos_idx.max()) + 1, dtype=torch.float64)
    qpos[:, arm.qpos_idx] = torch.tensor(q, dtype=torch.float64)
    ctrl = arm.action_to_ctrl(qpos, torch.zeros(len(q), int(arm.act_idx.max()) + 1), torch.tensor(a))
    return ctrl[:, arm.act_idx].double()


Q = [[0.1, -0.2, 0.3, 0.0, 0.5, 1.6], [0.0, 0.0, 0.0, 0.0, 0.0, 0.4]]
A = [[1.0, -0.5, 0.25, 0.0, -1.0, -0.9], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]


def test_delta_moves_each_joint_by_its_step(model: mujoco.MjModel) -> None:
    got = _targets(_arm(model, "delta"), Q, A)
    want = [[0.18, -0.24, 0.32, 0.0, 0.42, 1.6 - 0.135], [0.0, 0.0, 0.0, 0.0, 0.0, 0.4]]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)


def test_delta_absolute_gripper_maps_the_gripper_onto_its_range_within_a_step(model: mujoco.MjModel) -> None:
    """Arm joints as in "delta"; the gripper's a = -0.9 asks for low + 0.05 * (high - low), far below 1.6, so the
    target is capped one step (0.15 rad) closed from the measured 1.6; a = 0 asks for the middle of the range, more
    than a step above the measured 0.4, so it is capped one step open, at 0.55."""
    arm = _arm(model, "delta_absolute_gripper")
    low, high = float(arm.low[5]), float(arm.high[5])
    assert low + 0.05 * (high - low) < 1.45 and (low + high) / 2 > 0.55  # the caps below bind with this range
    got = _targets(arm, Q, A)
    want = [[0.18, -0.24, 0.32, 0.0, 0.42, 1.6 - 0.15], [0.0, 0.0, 0.0, 0.0, 0.0, 0.4 + 0.15]]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)
    # Within a step of the measured opening the target is the mapped one: a = -0.5 -> low + 0.25 * (high - low).
    mid = low + 0.25 * (high - low)
    got = _targets(arm, [[0.0] * 5 + [mid + 0.1]], [[0.0] * 5 + [-0.5]])
    assert float(got[0, 5]) == pytest.approx(mid, abs=1e-6)


def test_ctrl_to_action_inverts_each_mode(model: mujoco.MjModel) -> None:
    """Targets within a step of the joints come back as the actions that made them, in every mode."""
    for mode in so101.ACTION_MODES:
        arm = _arm(model, mode)
        q = torch.tensor([[0.1, -0.2, 0.3, 0.0, 0.5, 0.8]])
        a = torch.tensor([[0.5, -0.25, 0.1, 0.0, -0.3, 0.0]])
        if mode != "delta":  # an absolute target a step away at most from the measured joint
            a[0, 5] = float(2.0 * (0.85 - arm.low[5]) / (arm.high[5] - arm.low[5]) - 1.0)
        if mode == "absolute":
            a = 2.0 * (q + 0.01 - arm.low) / (arm.high - arm.low) - 1.0
        target = _targets(arm, q.tolist(), a.tolist()).float()
        torch.testing.assert_close(arm.ctrl_to_action(q, target), a, atol=1e-5, rtol=0, msg=mode)


def test_unknown_mode_names_the_known_ones(model: mujoco.MjModel) -> None:
    with pytest.raises(ValueError, match="delta_absolute_gripper"):
        _arm(model, "relative")
