"""``robot-rl deploy``: run an exported policy on an arm through LeRobot, safely, optionally recording and with a
person able to take over.

    robot-rl deploy robot=so101 robot.port=/dev/ttyACM0 robot.id=my_arm checkpoint=runs/<run> instruction="pick up the cube"
    robot-rl deploy robot=so101_sim robot.task=so101_pick robot.image_height=64 robot.image_width=64 \
        checkpoint=runs/<offline run> episodes=5 dataset.root=data/deploy teleop=so101_sim_leader takeover=keyboard

``checkpoint`` is any exported policy (a run, a checkpoint or an exported-policy folder): the flow VLA and policies
trained offline read LeRobot frames; a state policy trained in our simulator runs on ``so101_sim`` only (it reads the
scene's task state). Every command goes through ``real.safety.SafetyFilter`` (``safety.*``: joint limits from the
calibration minus ``safety.margin_deg``, a per-tick cap that cannot be switched off, malformed actions held) at the
robot's control rate (``fps``). ``dataset.root=DIR`` records each episode into a LeRobotDataset v3 as it ends
(``robot_rl.data.recorder``): ``action`` the command really sent, ``policy_action`` the policy's proposal,
``intervention`` the ticks a person drove (``teleop=<device>`` with ``takeover=keyboard``: a key or a pedal toggles;
``takeover=schedule`` with ``takeover_schedule=[ticks]`` for demos and tests). Torque goes off on every way out --
the end, an error, Ctrl-C, SIGTERM, a lost teleoperator, a stalled loop -- before the dataset is finalised.

Exit status: 0 done; 2 a bad config, checkpoint, calibration, port or camera (nothing moved); 4 a failed write;
5 a safety stop (``real.safety.SafeStop``: watchdog, bus lost, malformed actions, teleoperator lost, overheat); 1 any other
error in the loop (a policy or camera failure; torque off); 130 Ctrl-C; 143 SIGTERM. Each with one line on stderr.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from real.safety import SafetyConfig
from robot_rl.data.recorder import RecorderConfig

# configs/robot/<name>.yaml and configs/teleop/<name>.yaml -> the LeRobot device type each one configures (their
# schemas, every field with its default, come from these types' config classes: robot_rl.cli.schemas)
DEVICE_GROUPS = {"robot": {"so101": "so101_follower", "so101_sim": "so101_sim"},
                 "teleop": {"so101_leader": "so101_leader", "so101_sim_leader": "so101_sim_leader"}}
TAKEOVERS = ("none", "keyboard", "schedule")
_SIM_IDS = itertools.count()


@dataclass
class OptionalDataset(RecorderConfig):
    """``dataset.*`` of deploy: recording is optional."""

    root: str | None = None  # record the episodes into this LeRobotDataset v3 folder (None: do not record)


@dataclass
class SessionSettings:
    """What deploy and record share."""

    episodes: int = 1  # episodes to run
    episode_s: float = 30.0  # s, an episode's time limit (episode_s * fps ticks)
    fps: int = 30  # Hz, the control rate (the rate every SO-101 task is trained at)
    # the instruction in every frame (the episodes' task in a recording); None: the simulated robot's own (a real arm:
    # set it). Not ``task=``: that name picks a simulator task config in robot-rl's Hydra search path.
    instruction: str | None = None
    cameras: list[str] | None = None  # robot cameras read into frames; None: all of the robot's
    stop_on_success: bool = True  # end an episode when the robot reports success (so101_sim; a real arm never does)
    # Keys the person presses to end an episode (a real arm cannot report how it went): success_key ("s") when the
    # task is done (that tick's next.success is true, as LeRobot's HIL-SERL marks it), failure_key ("f") to give it
    # up. Read with the take-over's keyboard when takeover=keyboard. success_schedule / failure_schedule: ticks
    # (counted across episodes) marked so, for demos and tests.
    success_key: str | None = None
    failure_key: str | None = None
    success_schedule: list[int] = field(default_factory=list)
    failure_schedule: list[int] = field(default_factory=list)
    realtime: bool = True  # pace the loop at fps (false: as fast as it runs; for so101_sim in tests)
    seed: int | None = None  # so101_sim: scene seed of episode i is seed + i
    safety: SafetyConfig = field(default_factory=SafetyConfig)

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.fps < 1 or not self.episode_s > 0:
            raise ValueError(f"episodes and fps must be >= 1 and episode_s > 0, got {self.episodes}, {self.fps}, "
                             f"{self.episode_s}")
        if (self.success_key or self.failure_key) and (self.success_schedule or self.failure_schedule):
            raise ValueError("mark episodes by keys (success_key, failure_key) or by schedule (success_schedule, "
                             "failure_schedule), not both")
        if self.success_key is not None and self.success_key == self.failure_key:
            raise ValueError(f"success_key and failure_key are both {self.success_key!r}: give them different keys")


@dataclass
class DeployCommand(SessionSettings):
    """configs/deploy.yaml: ``robot-rl deploy`` (``robot`` and ``teleop`` are the groups chosen by name)."""

    checkpoint: str = MISSING  # a run folder, a checkpoint folder or an exported-policy folder (required)
    takeover: str = "none"  # none | keyboard (a key or a USB pedal toggles) | schedule (takeover_schedule)
    takeover_key: str = "space"  # the key for takeover=keyboard ("space", "t", "f12", ...)
    # ticks at which control switches (takeover=schedule), counted across episodes as success_schedule's are
    takeover_schedule: list[int] = field(default_factory=list)
    device: str = "cpu"  # the policy's device: cpu | cuda | cuda:<i> | auto
    torch_threads: int = 1  # torch intra-op threads
    # ticks ahead a chunked policy's next chunk is computed in a background thread (its first `lookahead` steps
    # skipped on arrival; real.teleop.PolicyDriver); 0: inside the tick that needs it
    lookahead: int = 0
    dataset: OptionalDataset = field(default_factory=OptionalDataset)
    robot: Any = None
    teleop: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.takeover not in TAKEOVERS:
            raise ValueError(f"takeover={self.takeover!r}; allowed: {list(TAKEOVERS)}")
        if self.lookahead < 0:
            raise ValueError(f"lookahead must be >= 0 ticks, got {self.lookahead}")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")
        for name in ("success_key", "failure_key"):
            if self.takeover == "keyboard" and getattr(self, name) == self.takeover_key:
                raise ValueError(f"{name} and takeover_key are both {self.takeover_key!r}: give them different keys")


# ------------------------------------------------------------------------------------------------ building
def device_classes(kind: str) -> dict[str, type]:
    """``kind`` "robot" | "teleop": the LeRobot config class of each device type ``DEVICE_GROUPS[kind]`` names
    (imported here, so they are registered with LeRobot). Needs LeRobot (``pip install -e '.[lerobot]'``)."""
    import lerobot.robots.so_follower
    import lerobot.teleoperators.so_leader  # noqa: F401 - registers so101_leader
    from lerobot.robots.config import RobotConfig
    from lerobot.teleoperators.config import TeleoperatorConfig

    import real.config_sim_robot
    import real.config_sim_teleop  # noqa: F401 - registers so101_sim_leader

    base = RobotConfig if kind == "robot" else TeleoperatorConfig
    return {n: base.get_choice_class(n) for n in DEVICE_GROUPS[kind].values()}


def _decode(kind: str, raw: dict[str, Any]) -> Any:
    """A LeRobot robot / teleoperator config from our group's dict: ``type`` picks the class, every other key is one
    of its fields (unknown keys, wrong types: a ValueError naming them)."""
    import draccus
    import lerobot.cameras.opencv  # noqa: F401 - registers the camera types the configs name
    from lerobot.robots.config import RobotConfig
    from lerobot.teleoperators.config import TeleoperatorConfig

    device_classes(kind)
    name = raw.pop("type", None)
    if "port" in raw and not raw["port"]:
        from real.safety import DeviceSetupError

        raise DeviceSetupError(f"{kind}.port is not set: the {name}'s serial port (e.g. {kind}.port=/dev/ttyACM0; "
                               "lerobot-find-port lists them)")
    base = RobotConfig if kind == "robot" else TeleoperatorConfig
    try:
        cls = base.get_choice_class(name)
    except Exception:  # noqa: BLE001 - draccus raises a KeyError or its own error
        raise ValueError(f"{kind}.type={name!r}: unknown; known: {sorted(base.get_known_choices())}") from None
    try:
        return draccus.decode(cls, raw)
    except Exception as e:  # noqa: BLE001 - draccus's DecodingError, or the config's own validation
        said = e  # draccus wraps the config's own ValueError in "Couldn't instantiate ...": show what that said
        while str(said).startswith("Couldn't instantiate") and (said.__cause__ or said.__context__) is not None:
            said = said.__cause__ or said.__context__
        raise ValueError(f"bad {kind} config ({name}): {said}") from None


def build_robot(raw: dict[str, Any]) -> Any:
    """The LeRobot ``Robot`` of the ``robot`` group (not connected). A calibration file that exists but is broken is
    refused here, naming it (LeRobot's constructor would fail on it with a parser trace)."""
    from lerobot.robots.utils import make_robot_from_config

    from real.safety import CalibrationError, load_calibration_file

    raw = dict(raw)
    if raw.get("type") == "so101_sim" and raw.get("id") is None:
        # a name of its own, so its simulated leader follows this robot (teleop.robot_id), not another in the process
        raw["id"] = f"so101_sim-{next(_SIM_IDS)}"
    cfg = _decode("robot", raw)
    try:
        robot = make_robot_from_config(cfg)
    except Exception as e:
        raise CalibrationError(f"robot id {cfg.id!r}: {type(e).__name__}: {str(e)[:200]}") from e
    bus = getattr(robot, "bus", None)
    if bus is not None and robot.calibration_fpath.is_file():
        load_calibration_file(robot.calibration_fpath, {m: mo.id for m, mo in bus.motors.items()})
    return robot


def build_teleop(raw: dict[str, Any] | None, robot: Any = None) -> Any:
    """The LeRobot ``Teleoperator`` of the ``teleop`` group (not connected), None without one. A simulated leader
    with no ``robot_id`` follows ``robot``."""
    if not raw:
        return None
    from lerobot.teleoperators.utils import make_teleoperator_from_config

    raw = dict(raw)
    if "robot_id" in raw and raw["robot_id"] is None and robot is not None:
        raw["robot_id"] = robot.id
    return make_teleoperator_from_config(_decode("teleop", raw))


def load_any_policy(path: str, device: Any) -> Any:
    """An exported policy folder as is; a run or checkpoint folder through its latest checkpoint's export."""
    from policies import load_policy
    from policies.persistence import CONFIG_FILE
    from robot_rl.checkpoint import POLICY_DIR, load_meta

    p = Path(path)
    if (p / CONFIG_FILE).is_file():
        return load_policy(p, device)
    folder, _ = load_meta(p)
    return load_policy(folder / POLICY_DIR, device)


def match_state_policy_scene(robot: Any, policy: Any, path: str) -> None:
    """A state policy trained in our simulator acts in that task's normalised actions, which the scene turns into
    joint targets its task's way (``action_mode``, ``max_delta``: the lift recipe's gripper is an opening, not a
    step). On ``so101_sim`` the scene is built from the task config of the run the policy came from, so the same
    actions move the arm the same way; a scene of another task is refused. A bare policy folder carries no task
    config: the scene keeps the task's defaults, and a warning says so. Policies on LeRobot frames (degrees) and
    robots other than so101_sim are left alone."""
    from policies.persistence import CONFIG_FILE
    from real.sim_robot import SO101SimRobot
    from robot_rl.checkpoint import load_meta
    from robot_rl.cli.build import reads_lerobot_frames
    from sim.registry import config_from_dict

    if not isinstance(robot, SO101SimRobot) or reads_lerobot_frames(policy):
        return
    meta = None if (Path(path) / CONFIG_FILE).is_file() else load_meta(Path(path))[1]
    if meta is None or "task" not in meta:
        print(f"deploy: {path} is a policy folder without its run's task config: so101_sim acts on its actions the "
              f"{robot.config.task} defaults' way (give the run folder to use the training's)", file=sys.stderr)
        return
    if meta["task"] != robot.config.task:
        raise ValueError(f"the policy was trained on {meta['task']!r}; robot.task={robot.config.task!r} builds another "
                         f"scene, whose state it cannot read: use robot.task={meta['task']}")
    robot.use_task_config(config_from_dict(meta["task"], meta["task_config"]))


def episode_mark(c: SessionSettings, takeover: Any = None) -> Any:
    """The person's marks on episodes (``success_key`` / ``failure_key``, or their schedules), or None; a keyboard
    take-over lends its keyboard, so one listener reads every key."""
    from real.teleop import KeyboardMark, KeyboardTakeover, ScheduledMark

    if c.success_schedule or c.failure_schedule:
        return ScheduledMark(c.success_schedule, c.failure_schedule)
    if c.success_key is None and c.failure_key is None:
        return None
    return KeyboardMark(c.success_key, c.failure_key,
                        takeover.keyboard if isinstance(takeover, KeyboardTakeover) else None)


def takeover_source(c: DeployCommand, teleop: Any) -> Any:
    from real.teleop import KeyboardTakeover, NeverHuman, ScheduledTakeover

    if c.takeover != "none" and teleop is None:
        raise ValueError(f"takeover={c.takeover} needs a teleoperator to hand control to: teleop=<device> "
                         "(configs/teleop/)")
    if c.takeover == "keyboard":
        return KeyboardTakeover(c.takeover_key)
    if c.takeover == "schedule":
        return ScheduledTakeover(c.takeover_schedule)
    return NeverHuman()


def check_dataset_root(root: str | None, append: bool) -> None:
    """Refuse, before anything connects, a dataset folder the recorder would refuse."""
    if root is None:
        return
    p = Path(root)
    if p.exists() and (not p.is_dir() or any(p.iterdir())) and not append:
        raise ValueError(f"dataset.root={root} exists and is not empty: pass dataset.append=true to add episodes to "
                         "the dataset there, or choose a new folder")


def connect_all(robot: Any, teleop: Any, safety: Any) -> None:
    """Connect the teleoperator, then the robot (``real.robot_env.safe_connect``: no prompt, no motion). A failure
    names the device; nothing has moved."""
    from real.robot_env import safe_connect
    from real.safety import DeviceSetupError

    if teleop is not None:
        try:
            teleop.connect(calibrate=False)
        except Exception as e:
            raise DeviceSetupError(f"teleop {teleop}: cannot connect ({type(e).__name__}: {e})") from e
    try:
        safe_connect(robot, safety)
    except BaseException:
        if teleop is not None and getattr(teleop, "is_connected", False):
            teleop.disconnect()
        raise


def session_kwargs(c: SessionSettings, robot: Any) -> dict[str, Any]:
    from real.robot_env import ControlClock

    cameras = c.cameras if c.cameras is not None else list(getattr(robot, "cameras", {}))
    return {"cameras": cameras, "task": c.instruction, "fps": float(c.fps), "max_episode_length": round(c.episode_s * c.fps),
            "clock": ControlClock(c.fps, sleep=c.realtime)}


def recorder_factory(dataset: RecorderConfig, c: SessionSettings, robot: Any, robot_type: str, cameras: list[str]
                     ) -> Any:
    """Makes the ``EpisodeRecorder`` inside the safety guard (so a failure there still turns torque off)."""
    def make() -> Any:
        from real.robot_env import RobotEnv  # noqa: F401 - the frames it writes are RobotEnv's
        from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder
        from sim.so101 import LEROBOT_STATE_NAMES

        feats = robot.observation_features
        spec = DatasetSpec(c.fps, tuple(LEROBOT_STATE_NAMES), {cam: tuple(feats[cam][:2]) for cam in cameras},
                           robot_type=robot_type, capture_time=True)
        return EpisodeRecorder(dataset, spec, 1, round(c.episode_s * c.fps))

    return make


def run_guarded(name: str, body: Any) -> Any:
    """Run a session; turn its way out into one line and an exit status (module docstring)."""
    import logging

    from real.safety import SafeStop, torque_off_note
    from robot_rl.checkpoint import OutputWriteError

    try:
        return body()
    except SafeStop as e:
        print(f"robot-rl {name}: safety stop ({type(e).__name__}): {e.reason}; {torque_off_note(e)}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None
    except KeyboardInterrupt as e:
        print(f"robot-rl {name}: interrupted; {torque_off_note(e)}", file=sys.stderr)
        raise SystemExit(130) from None
    except (ValueError, FileNotFoundError, OutputWriteError):
        raise  # robot-rl's own exit statuses: 2 (config, calibration, port, camera), 4 (a failed write)
    except Exception as e:
        logging.getLogger(__name__).debug("stopped", exc_info=True)
        print(f"robot-rl {name}: stopped by {type(e).__name__}: {str(e).strip()[:300]}; {torque_off_note(e)}",
              file=sys.stderr)
        raise SystemExit(1) from None


def summary(name: str, res: Any, root: str | None) -> None:
    clock = res.clock
    print(f"{name}: {res.episodes} episodes ({res.successes} successful), {res.frames} ticks, {res.human_ticks} by the "
          f"person ({res.switches} switches), {res.rejects} malformed actions held, {res.clips} commands clipped; "
          f"tick work p50 {clock.get('work_p50_ms', float('nan')):.1f} ms, p99 {clock.get('work_p99_ms', float('nan')):.1f}"
          f" ms, {int(clock.get('missed', 0))} missed deadlines"
          + (f"; dataset {root} ({res.written} episodes written" + (
              f", {res.late_episodes} with late ticks: left out of training by default" if res.late_episodes else "")
              + ")" if root else ""), file=sys.stderr)


# ------------------------------------------------------------------------------------------------ the command
def deploy(cfg: Any) -> Any:
    """``robot-rl deploy`` from a composed ``deploy`` config (module docstring). Returns the ``SessionResult``."""
    import torch
    from omegaconf import OmegaConf

    from real.safety import SafetyFilter, limits_from_robot
    from real.teleop import PolicyDriver, guarded_session
    from robot_rl.cli.config import resolve_device, typed

    raw = OmegaConf.to_container(cfg, resolve=True)
    robot_raw, teleop_raw = raw.pop("robot"), raw.pop("teleop", None)
    c = typed(DeployCommand, raw, "")
    device = resolve_device(c.device)
    torch.set_num_threads(c.torch_threads)
    check_dataset_root(c.dataset.root, c.dataset.append)
    policy = load_any_policy(c.checkpoint, device)  # a bad path or file fails before any device is touched
    robot = build_robot(robot_raw)
    match_state_policy_scene(robot, policy, c.checkpoint)
    teleop = build_teleop(teleop_raw, robot)
    takeover = takeover_source(c, teleop)
    mark = episode_mark(c, takeover)
    safety = SafetyFilter(c.safety, limits_from_robot(robot, c.safety.margin_deg))
    kwargs = session_kwargs(c, robot)
    connect_all(robot, teleop, safety)
    make_recorder = None
    if c.dataset.root is not None:
        make_recorder = recorder_factory(dataclasses.replace(c.dataset), c, robot, robot_raw["type"],
                                         kwargs["cameras"])

    def body() -> Any:
        try:
            return guarded_session(robot, safety, kwargs, c.episodes,
                                   make_driver=lambda env: PolicyDriver(policy, safety, robot, env, c.lookahead),
                                   teleop=teleop,
                                   takeover=takeover, make_recorder=make_recorder, stop_on_success=c.stop_on_success,
                                   seed=c.seed, mark=mark)
        finally:
            if mark is not None:
                mark.close()
            takeover.close()
            if teleop is not None and getattr(teleop, "is_connected", False):
                teleop.disconnect()

    res = run_guarded("deploy", body)
    summary("deploy", res, c.dataset.root)
    return res
