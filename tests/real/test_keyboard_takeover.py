"""The take-over key (or pedal): a press toggles between the policy and the person, a held key does not flip again,
and a session records exactly the ticks the person drove; where keys cannot be read, deploy says so before anything
moves.

No keyboard can be read on this headless machine (pynput captures only in an X11 session, on a Windows desktop or
on macOS), so the key presses come from ``FakeKeyboard``, a stand-in for LeRobot's ``KeyboardTeleop`` that returns
the keys held at each poll the way it does (characters, and pynput ``Key`` objects whose ``str`` is ``Key.<name>``).
The failure path runs LeRobot's real ``KeyboardTeleop``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies import keys
from real.robot_env import ControlClock, RobotEnv, safe_connect
from real.safety import SafetyConfig, SafetyConfigError, SafetyFilter, limits_from_robot
from real.teleop import FAILURE, SUCCESS, KeyboardMark, KeyboardTakeover, PolicyDriver, ScheduledMark, run_session
from tests.real._arm import MOTORS, ScriptedPolicy, ScriptedTeleop, follower
from tests.real.test_robot_env import no_cam_recorder

NAMES = tuple(f"{m}.pos" for m in MOTORS)


class _PynputKey:
    """What pynput hands LeRobot for a special key: ``str(Key.space) == "Key.space"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"Key.{self.name}"

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PynputKey) and other.name == self.name


class FakeKeyboard:
    """FAKE (no keyboard can be read here): LeRobot ``KeyboardTeleop.get_action()``'s answer at each poll, from a
    list of the keys held at that poll (polls past its end: nothing held)."""

    def __init__(self, held: list[set]) -> None:
        self.held, self.polls, self.disconnected = held, 0, False

    def get_action(self) -> dict:
        keys_now = self.held[self.polls] if self.polls < len(self.held) else set()
        self.polls += 1
        return dict.fromkeys(keys_now)

    def disconnect(self) -> None:
        self.disconnected = True


SPACE = _PynputKey("space")


def test_a_press_toggles_and_a_held_key_does_not_flip_again():
    held = [set(), {SPACE}, {SPACE}, {SPACE}, set(), {"t"}, {SPACE, "t"}, set(), {SPACE}, set()]
    board = FakeKeyboard(held)
    take = KeyboardTakeover("space", keyboard=board)
    assert [take.engaged() for _ in held] == [False, True, True, True, True, True, False, False, True, True]
    take.close()
    assert not board.disconnected  # the caller's keyboard stays the caller's
    by_char = KeyboardTakeover("t", keyboard=FakeKeyboard(held))
    assert [by_char.engaged() for _ in held] == [False] * 5 + [True] * 5  # pressed once (held two polls)


def test_marking_keys_mark_once_per_press_and_share_the_takeover_keyboard():
    held = [set(), {"s"}, {"s"}, set(), {SPACE, "s"}, {SPACE}, {"f"}, {"f"}, set(), {"s", "f"}, set()]
    board = FakeKeyboard([h for h in held for _ in range(2)])  # two readers poll the one keyboard each tick
    take, mark = KeyboardTakeover("space", keyboard=board), KeyboardMark("s", "f", keyboard=board)
    polled = [(take.engaged(), mark.poll()) for _ in held]
    # a held key marks once; "s" and "f" pressed on one tick: success
    assert [m for _, m in polled] == [None, SUCCESS, None, None, SUCCESS, None, FAILURE, None, None, SUCCESS, None]
    assert [t for t, _ in polled] == [False] * 4 + [True] * 7  # the take-over still toggles
    mark.close()
    assert not board.disconnected
    sched = ScheduledMark(success=[2], failure=[4])
    assert [sched.poll() for _ in range(6)] == [None, None, SUCCESS, None, FAILURE, None]


def test_a_session_records_the_ticks_between_two_presses_as_the_persons(tmp_path):
    """Space pressed (and held 3 ticks) at tick 10 and again at tick 25: ticks 10..24 are the person's: intervention
    and actor = human in the dataset, the person's command applied (the policy pushes shoulder_pan up, the person
    pulls it down), the policy's proposal kept beside it on every tick."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    robot, _bus = follower(tmp_path, None)
    cfg = SafetyConfig()
    safety = SafetyFilter(cfg, limits_from_robot(robot, cfg.margin_deg))
    safe_connect(robot, safety)
    n = 40
    held = [set() for _ in range(n)]
    for t in (10, 11, 12, 25, 26, 27):
        held[t] = {SPACE}
    human = np.zeros(n, bool)
    human[10:25] = True
    policy = ScriptedPolicy(lambda s, k: s + torch.tensor([[20.0, 0, 0, 0, 0, 0]]))
    teleop = ScriptedTeleop(lambda k: dict.fromkeys(NAMES, 0.0) | {"shoulder_pan.pos": -80.0, "gripper.pos": 50.0})
    rec = no_cam_recorder(tmp_path / "ds", n)
    env = RobotEnv(robot, safety, None, max_episode_length=n, clock=ControlClock(30, sleep=False))
    try:
        res = run_session(env, PolicyDriver(policy, safety, robot, env), teleop,
                          KeyboardTakeover("space", keyboard=FakeKeyboard(held)), rec, None, episodes=1)
    finally:
        rec.close()
        robot.disconnect()
    assert res.switches == 2 and res.human_ticks == 15
    df = LeRobotDataset("local/ds", root=tmp_path / "ds").hf_dataset.to_pandas()

    def col(name):
        return np.stack([np.asarray(v) for v in df[name]]).squeeze()

    assert np.array_equal(col(keys.INTERVENTION_COL).astype(bool), human)
    assert np.array_equal(col(keys.ACTOR_COL) == keys.ACTOR_HUMAN, human)
    step = col(keys.ACTION_COL)[:, 0] - col(keys.OBS_STATE)[:, 0]
    assert np.all(step[human] < 0) and np.all(step[~human] > 0)
    assert np.allclose(col(keys.POLICY_ACTION_COL)[:, 0] - col(keys.OBS_STATE)[:, 0], 20.0, atol=1e-3)


def test_where_keys_cannot_be_read_the_keyboard_takeover_is_refused_up_front():
    """LeRobot's own KeyboardTeleop on this headless machine (pynput absent, or present without a display): refused
    with what to do, instead of a session whose first key poll would raise."""
    with pytest.raises(SafetyConfigError, match="takeover=keyboard") as err:
        KeyboardTakeover("space")
    assert "takeover=schedule or takeover=none" in str(err.value)


def test_deploy_with_takeover_keyboard_here_exits_2_before_connecting(tmp_path, capsys):
    from real.sim_robot import live_robots
    from tests.real.test_deploy_cli import SIM, run_main, vla

    policy = vla(tmp_path / "vla")
    before = len(live_robots())
    argv = ["deploy", *SIM, f"checkpoint={policy}", "episodes=1", "episode_s=1", "teleop=so101_sim_leader",
            "takeover=keyboard", "realtime=false"]
    assert run_main(argv) == 2
    assert "takeover=keyboard" in capsys.readouterr().err
    assert not any(r.is_connected for r in live_robots()[before:])  # the arm deploy built was never connected
