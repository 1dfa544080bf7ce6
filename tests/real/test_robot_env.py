"""real/robot_env.py and real/teleop.py: the arm as a VecEnv, its clock, every exit path to torque-off, bus errors and
take-overs (RELIABILITY.md A4, A7, A12), on LeRobot's SO-101 follower over the fault bus and on so101_sim."""

from __future__ import annotations

import errno
import math
import os
import signal
import time

import numpy as np
import pytest
import torch

from policies import keys
from real.faults import FaultPlan, FaultyRobot, RobotFaults
from real.robot_env import REJECTED, ControlClock, RobotEnv, safe_connect
from real.safety import (
    BusLost,
    SafeStop,
    SafetyConfig,
    SafetyFilter,
    TeleopLost,
    Terminated,
    limits_from_robot,
    torque_off_note,
)
from real.teleop import NeverHuman, PolicyDriver, ScheduledTakeover, guarded_session, run_session
from robot_rl.checkpoint import OutputWriteError
from tests.real._arm import MOTORS, ScriptedPolicy, ScriptedTeleop, follower

NAMES = tuple(f"{m}.pos" for m in MOTORS)


def arm(tmp_path, plan=None, cfg=None, **kw):
    """A connected follower on the fault bus; ``plan``'s faults start after the connect."""
    import random

    robot, bus = follower(tmp_path, None, **kw)
    cfg = cfg or SafetyConfig()
    safety = SafetyFilter(cfg, limits_from_robot(robot, cfg.margin_deg))
    safe_connect(robot, safety)
    if plan is not None:
        bus.servos.plan, bus.servos.rng = plan, random.Random(plan.seed)
    return robot, bus, safety


def no_cam_recorder(root, length=32):
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig

    return EpisodeRecorder(RecorderConfig(root=str(root)), DatasetSpec(30, NAMES, {}), 1, length)


# ------------------------------------------------------------------------------------------------ contract
def test_robot_env_contract_on_so101_sim(tmp_path):
    """One env, no auto-reset: frames in LeRobot's convention (state [1, 6] float32 degrees, images uint8 [1, 3, H, W],
    task from the scene), info with the applied action (degrees, = what the robot reports it sent) and the actor;
    stepping past the episode's end without a reset is an error."""
    from real.config_sim_robot import SO101SimRobotConfig
    from real.sim_robot import SO101SimRobot

    robot = SO101SimRobot(SO101SimRobotConfig(task="so101_reach", id="sim", calibration_dir=tmp_path, image_height=48,
                                              image_width=64))
    safety = SafetyFilter(SafetyConfig(), limits_from_robot(robot, 2.0))
    safe_connect(robot, safety)
    try:
        env = RobotEnv(robot, safety, None, cameras=("front", "wrist"), max_episode_length=3,
                       clock=ControlClock(30, sleep=False))
        assert env.num_envs == 1 and env.autoreset is False and env.action_dim == 6
        frame, _ = env.reset()
        assert frame[keys.OBS_STATE].dtype == torch.float32 and frame[keys.OBS_STATE].shape == (1, 6)
        for cam in ("front", "wrist"):
            img = frame[keys.lerobot_image_key(cam)]
            assert img.dtype == torch.uint8 and img.shape == (1, 3, 48, 64) and int(img.max()) > 0
        assert frame[keys.TASK] == [robot.instruction] and robot.instruction
        target = frame[keys.OBS_STATE] + torch.tensor([[30.0, 0, 0, 0, 0, 0]])
        frame2, reward, terminated, truncated, info = env.step(target, actor=keys.ACTOR_HUMAN)
        applied = info[keys.ACTION_COL]
        # the first command after connect (torque-enable) stays within 1 deg; the next ones within 5 deg of present
        assert applied.shape == (1, 6) and float(applied[0, 0] - frame[keys.OBS_STATE][0, 0]) == pytest.approx(1.0, abs=1e-3)
        assert torch.equal(info[keys.APPLIED_ACTION], applied) and info[keys.ACTOR].tolist() == [keys.ACTOR_HUMAN]
        assert reward.shape == terminated.shape == truncated.shape == (1,) and terminated.dtype == torch.bool
        assert not bool(terminated[0]) and not bool(truncated[0]) and not info[REJECTED]
        assert torch.equal(info[keys.FINAL_OBS][keys.OBS_STATE], frame2[keys.OBS_STATE])  # no auto-reset: this frame
        assert keys.EPISODE not in info
        _, _, _, _, info = env.step(target)
        assert float(info[keys.ACTION_COL][0, 0] - frame2[keys.OBS_STATE][0, 0]) == pytest.approx(5.0, abs=1e-3)
        last, _, _, truncated, info = env.step(target)
        assert bool(truncated[0])
        # the episode's statistics as every backend gives them (robot_rl.env's contract, read by the runners)
        assert info[keys.EPISODE][keys.EP_LENGTH].tolist() == [3] and info[keys.EPISODE][keys.EP_RETURN].tolist() == [0]
        assert torch.equal(info[keys.FINAL_OBS][keys.OBS_STATE], last[keys.OBS_STATE])
        with pytest.raises(RuntimeError, match="reset"):
            env.step(target)
        env.reset()
        env.step(target)
    finally:
        robot.disconnect()



def test_frame_of_an_earlier_read_and_the_default_clock(tmp_path):
    """``frame(obs)`` is that read's frame, not the latest; without a clock the env paces itself at its fps (LeRobot's
    30 Hz by default); a clock of 0 fps is refused."""
    from real.config_sim_robot import SO101SimRobotConfig
    from real.sim_robot import SO101SimRobot

    robot = SO101SimRobot(SO101SimRobotConfig(task="so101_reach", id="sim", calibration_dir=tmp_path))
    safety = SafetyFilter(SafetyConfig(), limits_from_robot(robot, 2.0))
    safe_connect(robot, safety)
    try:
        assert RobotEnv(robot, safety).clock.period == pytest.approx(1 / 30)
        env = RobotEnv(robot, safety, fps=50, clock=None)
        assert env.clock.period == pytest.approx(0.02) and env.control_dt == pytest.approx(0.02)
        env.clock.sleep = False
        frame, _ = env.reset()
        first = env.observe()
        first_state = env.frame()[keys.OBS_STATE]  # the latest read's frame, taken then
        env.step(frame[keys.OBS_STATE] + torch.tensor([[5.0, 0, 0, 0, 0, 0]]))
        env.step(frame[keys.OBS_STATE] + torch.tensor([[10.0, 0, 0, 0, 0, 0]]))
        env.observe()
        assert not torch.equal(env.frame()[keys.OBS_STATE], first_state)  # the arm moved between the two reads
        assert torch.equal(env.frame(first)[keys.OBS_STATE], first_state)
    finally:
        robot.disconnect()
    with pytest.raises(ValueError, match="fps must be > 0"):
        ControlClock(0.0)


def _sim_env(tmp_path, **kw):
    """so101_sim connected behind its filter, and a RobotEnv on it that does not sleep."""
    from real.config_sim_robot import SO101SimRobotConfig
    from real.sim_robot import SO101SimRobot

    robot = SO101SimRobot(SO101SimRobotConfig(task="so101_pick", id="sim", calibration_dir=tmp_path))
    safety = SafetyFilter(SafetyConfig(), limits_from_robot(robot, 2.0))
    safe_connect(robot, safety)
    return robot, safety, RobotEnv(robot, safety, clock=ControlClock(30, sleep=False), **kw)


def test_a_given_task_names_every_frame_and_without_one_each_scene_names_its_own(tmp_path):
    robot, safety, env = _sim_env(tmp_path, task="wave at the camera")
    try:
        frame, _ = env.reset(seed=1)
        assert robot.instruction != "wave at the camera" and frame[keys.TASK] == ["wave at the camera"]
        frame, *_ = env.step(frame[keys.OBS_STATE])
        assert frame[keys.TASK] == ["wave at the camera"] and env.instructions == ["wave at the camera"]
        own = RobotEnv(robot, safety, clock=ControlClock(30, sleep=False))
        names = set()
        for seed in range(2, 8):  # so101_pick names one of three cubes per scene
            frame, _ = own.reset(seed=seed)
            assert frame[keys.TASK] == [robot.instruction]
            names.add(robot.instruction)
        assert len(names) > 1
    finally:
        robot.disconnect()


def test_capture_time_counts_from_the_episodes_first_read(tmp_path):
    robot, _, env = _sim_env(tmp_path)
    try:
        frame, _ = env.reset()
        first = env.present.copy(), env._obs.time
        assert frame[keys.CAPTURE_TIME_COL].tolist() == [0.0]
        for _ in range(3):
            frame, *_ = env.step(frame[keys.OBS_STATE])
        elapsed = env._obs.time - first[1]
        assert 0 < elapsed < 5 and frame[keys.CAPTURE_TIME_COL].item() == pytest.approx(elapsed, abs=1e-6)
        frame, _ = env.reset()  # a new episode counts from its own first read
        assert frame[keys.CAPTURE_TIME_COL].tolist() == [0.0]
    finally:
        robot.disconnect()


def test_degree_targets_of_any_batch_shape_become_robot_units_and_a_chunk_is_judged_at_its_own_horizon(tmp_path,
                                                                                                     monkeypatch):
    from real import features

    robot, safety, env = _sim_env(tmp_path)
    try:
        frame, _ = env.reset()
        deg = frame[keys.OBS_STATE][0] + torch.tensor([1.0, -1, 1, -1, 1, 2])
        units = features.deg_to_robot(deg.double(), env.gripper)
        assert torch.equal(env.to_robot_units(deg), units)  # [6] as [1, 6]
        assert torch.equal(env.to_robot_units(deg[None])[0], units)
        assert env.to_robot_units("not an action") == "not an action"  # the filter judges it
        horizons = []
        command = safety.command
        monkeypatch.setattr(safety, "command", lambda *a, chunk_horizon=None: horizons.append(chunk_horizon) or
                            command(*a, chunk_horizon=chunk_horizon))
        chunk = frame[keys.OBS_STATE][:, None].repeat(1, 4, 1)  # [1, H = 4, 6]: H is not the action size
        env.step(chunk)
        env.step(chunk, horizon=4)
        env.step(frame[keys.OBS_STATE])
        assert horizons == [4, 4, None]
    finally:
        robot.disconnect()


def test_a_failed_read_is_retried_as_configured_and_a_stale_tick_reports_the_last_command(tmp_path, monkeypatch):
    """Every try of one tick's read fails: 1 + read_retries tries (the retries counted), the tick is stale, nothing is
    sent, and its applied action is the command the servos still hold (the previous tick's)."""
    from real.robot_env import STALE

    robot, safety, env = _sim_env(tmp_path)
    try:
        frame, _ = env.reset()
        target = frame[keys.OBS_STATE] + torch.tensor([[0.5, 0, 0, 0, 0, 0]])
        _, _, _, _, info = env.step(target)
        held = info[keys.APPLIED_ACTION].clone()
        assert not info[STALE] and env.counters()["bus/retries"] == 0
        get, tries, sends = robot.get_observation, [], []
        monkeypatch.setattr(robot, "get_observation", lambda: tries.append(1) or (_ for _ in ()).throw(
            ConnectionError("no status packet")))
        _, _, _, _, info = env.step(target + 1.0)  # sends (the read before it was fresh), then its read fails
        retries = safety.cfg.read_retries
        assert retries >= 1 and len(tries) == 1 + retries and info[STALE]
        assert env.counters()["bus/retries"] == retries and env.counters()["bus/read_failures"] == 1 + retries
        sent_before_stale = info[keys.APPLIED_ACTION].clone()
        assert not torch.equal(sent_before_stale, held)
        send = robot.send_action
        monkeypatch.setattr(robot, "send_action", lambda a: sends.append(a) or send(a))
        fails = [ConnectionError("one lost packet")]  # the next tick's read fails once, then its retry answers
        monkeypatch.setattr(robot, "get_observation", lambda: (_ for _ in ()).throw(fails.pop()) if fails else get())
        _, _, _, _, info = env.step(target + 2.0)  # no fresh read before it: nothing sent, the last command holds
        assert sends == [] and torch.equal(info[keys.APPLIED_ACTION], sent_before_stale) and not info[STALE]
        assert env.counters()["bus/retries"] == retries + 1 and env.counters()["bus/read_failures"] == 2 + retries
    finally:
        robot.disconnect()


def test_connect_turns_lerobots_read_retries_off_and_rearms_the_first_tick_cap(tmp_path):
    """On LeRobot's follower: its own read retries are off (the env retries and counts, A7); every connect, a
    reconnect too, caps the next command at first_tick_tol from where the arm is (A3)."""
    robot, bus, safety = arm(tmp_path)
    try:
        assert robot.config.num_read_retries == 0
        present = np.array([float(robot.get_observation()[n]) for n in safety.names])
        far = present + 20 * safety.limits.units_per_deg
        first = safety.command(far, present)
        assert np.all(np.abs(first.values - present) <= safety.first_cap + 1e-9)
        second = safety.command(far, present)
        assert np.any(np.abs(second.values - present) > safety.first_cap + 1e-6)  # the normal cap after it
        bus.disconnect(disable_torque=False)
        safe_connect(robot, safety)
        again = safety.command(far, present)
        assert np.all(np.abs(again.values - present) <= safety.first_cap + 1e-9)
    finally:
        bus.disconnect(disable_torque=False)
    sim, sim_safety, env = _sim_env(tmp_path / "sim")  # a robot without a motor bus (so101_sim): the same on reconnect
    try:
        env.reset()
        present = env.present.copy()
        far = present + 20 * sim_safety.limits.units_per_deg
        sim_safety.command(far, present)
        assert np.any(np.abs(sim_safety.command(far, present).values - present) > sim_safety.first_cap + 1e-6)
        sim.disconnect()
        safe_connect(sim, sim_safety)
        assert np.all(np.abs(sim_safety.command(far, present).values - present) <= sim_safety.first_cap + 1e-9)
    finally:
        sim.disconnect()


def test_control_clock_paces_at_30hz_and_counts_missed_deadlines(monkeypatch):
    """On a simulated clock (the pacing logic, not the OS scheduler: real tick times are the benchmark's,
    benchmarks/deploy_loop.py): 30 ticks of 5 ms work at 30 Hz sleep to periods of exactly 1/30 s with no miss; a tick
    of 50 ms work is one missed deadline and the next deadline restarts from it (a full period, no burst)."""
    from real import robot_env

    now = [100.0]

    class FakeTime:
        @staticmethod
        def perf_counter() -> float:
            return now[0]

        @staticmethod
        def sleep(dt: float) -> None:
            assert dt >= 0
            now[0] += dt

    monkeypatch.setattr(robot_env, "time", FakeTime)
    clock = ControlClock(30)
    clock.start()
    for _ in range(30):
        now[0] += 0.005
        clock.wait()
    s = clock.stats()
    assert s["missed"] == 0 and s["ticks"] == 30
    assert s["period_p50_ms"] == pytest.approx(1000 / 30, abs=1e-6) and s["work_p50_ms"] == pytest.approx(5, abs=1e-6)
    now[0] += 0.05  # overruns the period
    clock.wait()
    assert clock.missed == 1
    t0 = now[0]
    clock.wait()  # no work: sleeps one full period from the missed tick, not a catch-up burst
    assert clock.missed == 1 and now[0] - t0 == pytest.approx(1 / 30, abs=1e-9)
    # work of 30 x 5 ms, 50 ms and 0 ms: p99 interpolates numpy's way between the 31st and 32nd of 32 (5 + 0.69 x 45)
    s = clock.stats()
    assert s["ticks"] == 32 and s["work_max_ms"] == pytest.approx(50.0, abs=1e-6)
    assert s["work_p99_ms"] == pytest.approx(36.05, abs=1e-6) and s["work_p50_ms"] == pytest.approx(5.0, abs=1e-6)


# ------------------------------------------------------------------------------------------------ A4
SITES = ["camera", "policy", "nan_chunk", "add_frame", "save_episode", "keyboard_interrupt", "sigterm",
         "teleop_disconnect"]
EXPECTED = {"camera": TimeoutError, "policy": RuntimeError, "nan_chunk": SafeStop, "add_frame": OutputWriteError,
            "save_episode": OutputWriteError, "keyboard_interrupt": KeyboardInterrupt, "sigterm": Terminated,
            "teleop_disconnect": TeleopLost}


@pytest.mark.parametrize("trial", [0, 1])
@pytest.mark.parametrize("site", SITES)
def test_a4_every_exit_path_turns_torque_off_before_finalize(tmp_path, site, trial):
    """An exception at each site (2 trials each, at different ticks): the typed error reaches the caller, the bus
    records Torque_Enable = 0 on all six ids within 100 ms of the fault, and LeRobot's finalize() (the recorder's
    close) runs only after torque is off. The first episode (10 ticks) is committed before the faults of the loop."""
    robot, bus, safety = arm(tmp_path, cfg=SafetyConfig(max_consecutive_rejects=3))
    k = 14 + 3 * trial  # a tick inside the second episode
    t_fault: list[float] = []
    faults = RobotFaults()

    def on_tick(t: int) -> None:
        if t == k and site in ("camera", "keyboard_interrupt", "sigterm"):
            t_fault.append(time.monotonic())
            if site == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)

    if site == "camera":
        faults.camera_error_at_tick = k
    if site == "keyboard_interrupt":
        faults.raise_at_tick = {k: KeyboardInterrupt()}
    faulty = FaultyRobot(robot, faults, on_tick)

    def policy_fn(state, n):
        if site == "policy" and n == k:
            t_fault.append(time.monotonic())
            raise RuntimeError("injected: policy forward failed")
        if site == "nan_chunk" and n >= k:
            t_fault[:] = [time.monotonic()]
            return torch.full((1, 6), math.nan)
        return state + 1.0

    events: dict[str, float] = {}

    def make_recorder():
        rec = no_cam_recorder(tmp_path / "ds")
        finalize = rec.ds.finalize

        def timed_finalize():
            events["finalize"] = time.monotonic()
            finalize()

        rec.ds.finalize = timed_finalize
        if site in ("add_frame", "save_episode"):
            name = "add_frame" if site == "add_frame" else "save_episode"
            orig, calls = getattr(rec.ds, name), []

            def failing(*a, **kw):
                calls.append(1)
                if (name == "add_frame" and len(calls) > 10) or (name == "save_episode" and len(calls) > 1):
                    t_fault.append(time.monotonic())
                    raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "ds" / "data"))
                return orig(*a, **kw)

            setattr(rec.ds, name, failing)
        return rec

    def leader(n: int) -> dict[str, float]:
        if n > 2:
            t_fault.append(time.monotonic())
            raise ConnectionError("injected: leader unplugged")
        return dict.fromkeys(NAMES, 0.0) | {"gripper.pos": 50.0}

    teleop = ScriptedTeleop(leader)
    takeover = ScheduledTakeover([k]) if site == "teleop_disconnect" else NeverHuman()
    with pytest.raises(EXPECTED[site]):
        guarded_session(faulty, safety, {"max_episode_length": 10, "clock": ControlClock(30, sleep=False)},
                        episodes=3, make_driver=lambda env: PolicyDriver(ScriptedPolicy(policy_fn), safety, faulty,
                                                                         env),
                        teleop=teleop, takeover=takeover, make_recorder=make_recorder)
    assert t_fault, "the fault was not injected"
    off = {i: t for t, i, v, ok in bus.servos.torque_writes if v == 0 and ok and t >= t_fault[0]}
    assert sorted(off) == [1, 2, 3, 4, 5, 6], f"torque still on for {sorted(set(range(1, 7)) - set(off))}"
    assert max(off.values()) - t_fault[-1] <= 0.1, f"torque off {1e3 * (max(off.values()) - t_fault[-1]):.0f} ms late"
    if "finalize" in events:
        assert events["finalize"] > max(off.values())
    if site not in ("add_frame", "save_episode"):
        assert "finalize" in events  # the committed episode's dataset was finalized, after torque-off
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/ds", root=tmp_path / "ds")
    assert ds.meta.total_episodes == 1 and len(ds) == 10  # the episode committed before the fault is intact


# ------------------------------------------------------------------------------------------------ A7
def test_a7_transient_bus_errors_are_retried_and_a_sustained_rate_stops(tmp_path):
    """1% of bus reads fail ("Incorrect status packet"): 2,000 ticks (the 100,000-tick run is nightly), 0 aborts, the
    retries counted and exported, busy time p99 <= 40 ms. Then 8% of reads fail: the error rate over the window
    passes 5% and the loop stops with BusLost, torque off."""
    robot, bus, safety = arm(tmp_path, FaultPlan(read_error_rate=0.01, seed=1))
    policy = ScriptedPolicy(lambda s, n: s + torch.tensor([[2.0, -2, 2, -2, 2, 1]]) * (1 if (n // 50) % 2 else -1))
    env = RobotEnv(robot, safety, None, max_episode_length=2000, clock=ControlClock(30, sleep=False))
    res = run_session(env, PolicyDriver(policy, safety, robot, env), None, NeverHuman(), None, None, episodes=1)
    assert res.frames == 2000 and bus.servos.read_failures > 10
    assert res.retries == bus.servos.read_failures and env.counters()["bus/retries"] == res.retries
    assert res.clock["work_p99_ms"] <= 40
    robot2, bus2, safety2 = arm(tmp_path / "b", FaultPlan(read_error_rate=0.08, seed=2))
    with pytest.raises(BusLost, match="error rate"):
        guarded_session(robot2, safety2, {"max_episode_length": 100_000, "clock": ControlClock(30, sleep=False)},
                        episodes=1, make_driver=lambda env: PolicyDriver(policy, safety2, robot2, env), watchdog=False)
    assert all(not bus2.servos.torque_on(i) for i in range(1, 7))


@pytest.mark.parametrize("os_error", [False, True], ids=["no_status_packet", "port_oserror"])
def test_a6_lost_bus_stops_writing_and_turns_torque_off(tmp_path, os_error):
    """The connection drops at tick 40 (nothing answers, or the unplugged port raises OSError on every transaction):
    no Goal_Position write after the first failed read, BusLost after 3 ticks without a read, and a torque-off attempt
    on every motor (which, on a dead bus, fails and is named: the servos hold torque until power is cut)."""
    robot, bus, safety = arm(tmp_path, FaultPlan(drop_from_tick=40, fail_latency_s=0.001,
                                                 drop_raises_os_error=os_error))
    policy = ScriptedPolicy(lambda s, n: s + 1.0)
    before = len(bus.servos.torque_writes)  # connect's own (configure: off, then on)
    with pytest.raises(BusLost, match="3 ticks") as info:
        guarded_session(robot, safety, {"max_episode_length": 1000, "clock": ControlClock(30, sleep=False)},
                        episodes=1, make_driver=lambda env: PolicyDriver(policy, safety, robot, env), watchdog=False)
    # the operator is told torque-off failed, on which motors, and to cut the power (not "torque was turned off")
    note = torque_off_note(info.value)
    assert note.startswith("TORQUE-OFF FAILED") and all(m in note for m in MOTORS) and "e-stop" in note
    assert len(bus.servos.goal_ticks) == 40  # ticks 0 (connect's hold) .. 39; nothing sent once the bus is gone
    attempts = bus.servos.torque_writes[before:]
    assert all(w[2] == 0 for w in attempts)
    assert sorted({w[1] for w in attempts}) == [1, 2, 3, 4, 5, 6] and not any(w[3] for w in attempts)


# ------------------------------------------------------------------------------------------------ A12
def test_a12_takeover_is_immediate_and_every_intervention_frame_is_tagged(tmp_path):
    """200 switches policy <-> person over 400 ticks: the person's command is applied on the very tick the switch is
    read (latency 0 ticks), every frame of the schedule carries intervention = True (100%) and actor = human in the
    dataset, ``policy_action`` keeps the policy's proposal beside the applied ``action``; policy frames carry
    intervention = False."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    robot, _bus, safety = arm(tmp_path)
    switches = list(range(1, 401, 2))  # 200 switches over 400 ticks, the last on tick 399 (back to the policy)
    human = np.zeros(400, bool)
    for a, b in zip(switches[::2], switches[1::2], strict=True):
        human[a:b] = True
    # the policy pushes shoulder_pan up, the person pulls it down: the sign of each applied step says who drove
    policy = ScriptedPolicy(lambda s, n: s + torch.tensor([[20.0, 0, 0, 0, 0, 0]]))
    teleop = ScriptedTeleop(lambda n: dict.fromkeys(NAMES, 0.0) | {"shoulder_pan.pos": -80.0, "gripper.pos": 50.0})
    rec = no_cam_recorder(tmp_path / "ds", 400)
    env = RobotEnv(robot, safety, None, max_episode_length=400, clock=ControlClock(30, sleep=False))
    res = run_session(env, PolicyDriver(policy, safety, robot, env), teleop, ScheduledTakeover(switches), rec, None,
                      episodes=1)
    rec.close()
    assert res.switches == 200 and res.human_ticks == int(human.sum()) == 200
    ds = LeRobotDataset("local/ds", root=tmp_path / "ds")
    df = ds.hf_dataset.to_pandas()
    assert len(df) == 400

    def col(name):
        return np.stack([np.asarray(v) for v in df[name]]).squeeze()

    inter, actor = col(keys.INTERVENTION_COL).astype(bool), col(keys.ACTOR_COL)
    state, action, proposal = col(keys.OBS_STATE), col(keys.ACTION_COL), col(keys.POLICY_ACTION_COL)
    assert np.array_equal(inter, human) and np.array_equal(actor == keys.ACTOR_HUMAN, human)
    step = action[:, 0] - state[:, 0]
    assert np.all(step[human] < 0) and np.all(step[~human] > 0)  # who drove, on every tick, switch ticks included
    assert np.allclose(proposal[:, 0] - state[:, 0], 20.0, atol=1e-3)  # the policy's own proposal, every frame


def test_a12_teleop_lost_during_takeover_holds_and_never_returns_to_the_policy(tmp_path):
    """The leader fails on the 3rd tick of a take-over: that tick holds the present position, the session stops with
    TeleopLost and torque goes off; no command after the hold, the policy's included."""
    robot, bus, safety = arm(tmp_path)
    policy = ScriptedPolicy(lambda s, n: s + 3.0)

    def leader(n):
        if n >= 3:
            raise ConnectionError("leader unplugged")
        return dict.fromkeys(NAMES, 0.0) | {"gripper.pos": 50.0}

    with pytest.raises(TeleopLost, match="not returned to the policy"):
        guarded_session(robot, safety, {"max_episode_length": 100, "clock": ControlClock(30, sleep=False)},
                        episodes=1, make_driver=lambda env: PolicyDriver(policy, safety, robot, env),
                        teleop=ScriptedTeleop(leader), takeover=ScheduledTakeover([10]))
    writes = bus.servos.goal_ticks[1:]
    assert len(writes) == 10 + 2 + 1  # 10 policy ticks, 2 by the person, 1 hold
    last = writes[-1][1]
    held = {i: bus.servos.get(i, "Present_Position") for i in range(1, 7)}
    assert all(abs(last[i] - held[i]) <= 12 for i in range(1, 7))
    assert all(not bus.servos.torque_on(i) for i in range(1, 7))


@pytest.mark.parametrize("lookahead", [0, 2])
def test_async_chunk_inference_executes_each_step_at_its_planned_tick(tmp_path, lookahead):
    """A chunk planned from the frame of tick f has its step k meant for tick f + k. With lookahead L the next chunk
    is computed in the background from the frame L ticks before the queue runs out, and its first L steps (their
    ticks have passed) are skipped: every tick executes the step planned for it, and every chunk after the first is
    computed off the loop's thread. A reset while a chunk is being computed drops it: the next tick plans from its
    own frame."""
    import threading

    _robot, _bus, safety = arm(tmp_path)
    threads = []

    def plan(state, call):  # the frame of tick f holds f in every joint; step k of its chunk is 100 f + k
        threads.append(threading.current_thread().name)
        f = float(state[0, 0])
        return torch.stack([torch.full((6,), 100.0 * f + k) for k in range(6)])[None]

    driver = PolicyDriver(ScriptedPolicy(plan, horizon=6, executed_steps=3), safety, None, None, lookahead=lookahead)
    done = []
    for t in range(20):
        sent, proposal = driver.propose({keys.OBS_STATE: torch.full((1, 6), float(t))})
        v = float(sent[0, 0])
        assert torch.equal(sent, proposal)
        f, k = divmod(round(v), 100)
        assert f + k == t, (t, v)  # the step planned for this very tick
        done.append(k)
    if lookahead == 0:
        assert done[:6] == [0, 1, 2, 0, 1, 2] and set(threads) == {threading.current_thread().name}
    else:
        assert done[:9] == [0, 1, 2, 2, 3, 4, 2, 3, 4]  # 3 steps per chunk, the first 2 of each later one skipped
        assert threads[0] == threading.current_thread().name and threads[1:]
        assert all(n.startswith("policy-inference") for n in threads[1:])
        assert driver._pending is not None  # tick 19 sent the next chunk to the background; a reset drops it
        driver.reset()
        sent, _ = driver.propose({keys.OBS_STATE: torch.full((1, 6), 20.0)})
        assert float(sent[0, 0]) == 2000.0  # planned from tick 20's own frame, step 0
        driver.close()


def test_the_driver_executes_the_policys_steps_for_the_frames_instruction(tmp_path):
    _robot, _bus, safety = arm(tmp_path)

    class PerTask(ScriptedPolicy):
        def executed_steps_for(self, task):
            return 2 if task == "stack" else self.executed_steps

    def plan(state, call):  # step k of the c-th chunk is 100 c + k
        return torch.stack([torch.full((6,), 100.0 * call + k) for k in range(6)])[None]

    for task, want in (("stack", [100, 101, 200, 201, 300, 301]), ("other", [100, 101, 102, 200, 201, 202])):
        driver = PolicyDriver(PerTask(plan, horizon=6, executed_steps=3), safety, None, None)
        got = [round(float(driver.propose({keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: [task]})[0][0, 0]))
               for _ in range(6)]
        assert got == want, task


def test_the_driver_blends_chunks_for_an_instruction_the_policy_ensembles(tmp_path):
    """ACT's temporal ensembling as ``ActionQueue`` runs it in simulation: each step the weighted mean of every
    chunk's prediction for it, oldest first, w_i = exp(-m i); other instructions keep the queue."""
    import math
    _robot, _bus, safety = arm(tmp_path)

    class Ensembling(ScriptedPolicy):
        def executed_steps_for(self, task):
            return 2 if task == "stack" else self.executed_steps

        def temporal_ensemble_for(self, task):
            return 1.0 if task == "stack" else None

    def plan(state, call):  # step k of the c-th chunk is 100 c + k; 5 steps: not the action size (6)
        return torch.stack([torch.full((6,), 100.0 * call + k) for k in range(5)])[None]

    e = math.exp(-1.0)
    # chunks at ticks 0, 2, 4: tick 2 blends chunk 1's step 2 (weight 1) with chunk 2's step 0 (e^-1); tick 4 chunk
    # 1's step 4, chunk 2's step 2 (e^-1) and chunk 3's step 0 (e^-2)
    want = {"stack": [100, 101, (102 + 200 * e) / (1 + e), (103 + 201 * e) / (1 + e),
                      (104 + 202 * e + 300 * e * e) / (1 + e + e * e)],
            "other": [100, 101, 102, 200, 201]}
    for task, expected in want.items():
        driver = PolicyDriver(Ensembling(plan, horizon=5, executed_steps=3), safety, None, None)
        got = [float(driver.propose({keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: [task]})[0][0, 0])
               for _ in range(5)]
        assert got == pytest.approx(expected, abs=1e-4), task
    driver.reset()  # a new episode starts from its own first chunk, nothing blended in
    assert float(driver.propose({keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: ["stack"]})[0][0, 0]) == 300.0


def test_a_rejected_chunk_is_not_blended_into_the_next(tmp_path):
    """A malformed chunk (NaN) is handed on for the filter to reject and nothing of it is kept: the next chunk starts
    its own blend, not one with the chunk before the rejected one; and a two-step chunk is a chunk."""
    import math
    _robot, _bus, safety = arm(tmp_path)

    class Ensembling(ScriptedPolicy):
        def executed_steps_for(self, task):
            return 1

        def temporal_ensemble_for(self, task):
            return 1.0

    def plan(state, call):  # chunk 2 is malformed; step k of the c-th chunk is 100 c + k
        chunk = torch.stack([torch.full((6,), 100.0 * call + k) for k in range(4)])[None]
        return chunk * math.nan if call == 2 else chunk

    driver = PolicyDriver(Ensembling(plan, horizon=4, executed_steps=1), safety, None, None)
    frame = {keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: ["stack"]}
    sent, proposal = driver.propose(frame)
    assert float(proposal[0, 0]) == 100.0
    sent, proposal = driver.propose(frame)
    assert proposal is None and torch.isnan(torch.as_tensor(sent)).all()  # for the env's filter to reject
    assert float(driver.propose(frame)[1][0, 0]) == 300.0  # chunk 3 alone: chunk 1 is not blended in

    two = PolicyDriver(ScriptedPolicy(lambda s, c: torch.stack([torch.full((6,), 10.0 * c + k) for k in range(2)])[None],
                                      horizon=2), safety, None, None)
    assert [float(two.propose(frame)[1][0, 0]) for _ in range(4)] == [10.0, 11.0, 20.0, 21.0]


def test_a_lookahead_that_skips_the_whole_chunk_is_refused(tmp_path):
    from real.safety import SafetyConfigError

    _robot, _bus, safety = arm(tmp_path)
    with pytest.raises(SafetyConfigError, match="lookahead 4"):
        PolicyDriver(ScriptedPolicy(lambda s, n: s, horizon=4), safety, None, None, lookahead=4)
