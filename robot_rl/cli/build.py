"""The public build API: compose a config, seed, and build the env, the algorithm and the runner of a run.

The CLI, the benchmarks and the tests build runs the same way, through these functions:

    cfg = compose("train", ["task=so101_reach", "algo=ppo", "total_steps=50000"])
    run = build_training(cfg)          # env, algorithm, runner, logger, run folder (resumed if cfg.resume)
    run.runner.learn()                 # or: run.runner.start(); run.runner.run_iteration() ...
    run.close()

``ALGORITHMS`` is the one table of learners: each entry says how to build the learner from its config and which
runner drives it. This package (``robot_rl/cli``) is the only place that wires ``sim`` into ``robot_rl``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from policies import keys
from policies.gaussian import GaussianPolicy, GaussianPolicyConfig
from policies.tanh_gaussian import TanhGaussianPolicy, TanhGaussianPolicyConfig
from robot_rl.algos.base import Algorithm
from robot_rl.algos.flashsac import FlashSAC, FlashSACConfig
from robot_rl.algos.ppo import PPO, PPOConfig
from robot_rl.buffers.replay import ReplayBuffer
from robot_rl.checkpoint import CheckpointManager, ResumeMismatchError, check_resume_compatible, load_checkpoint
from robot_rl.cli.config import (
    CheckpointSettings,
    DemoDatasetSettings,
    EvalSettings,
    HilSettings,
    RewardSettings,
    TrainSettings,
    changed_settings,
    resolve_device,
    typed,
)
from robot_rl.cli.load import other_load, thread_warning
from robot_rl.distributed import ProcessGroup, check_world_size, from_environment, rank_device
from robot_rl.env import VecEnv
from robot_rl.hil.agent import InterventionAgent
from robot_rl.logging import LoggerConfig, RunLogger, SilentLogger
from robot_rl.models.critics import CriticConfig, MLPCritic
from robot_rl.models.q_critics import CategoricalQ, CategoricalQConfig
from robot_rl.remote.settings import RemoteSettings
from robot_rl.runners.common import RunLimits, available_cores
from robot_rl.runners.off_policy import OffPolicyRunner, OffPolicyRunnerConfig
from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def compose(command: str, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """The Hydra config of ``robot-rl <command>`` (``configs/<command>.yaml``) with ``key=value`` overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from robot_rl.cli.schemas import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=command, overrides=list(overrides))


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------------------------- learners
def _flat_group(env: VecEnv, key: str, algo: str) -> int:
    shape = env.obs_spec.shapes[key]
    if len(shape) != 1:
        raise ValueError(f"algo={algo} needs a flat '{key}' observation, the env gives shape {shape}")
    return shape[0]


def _actor_config(cls: type, algo_raw: dict[str, Any], section: str, env: VecEnv, algo: str) -> Any:
    """The actor's config from ``algo.<section>``, sized to the env's flat ``policy`` group and its actions."""
    values = {**algo_raw.pop(section, {}), "obs_dim": _flat_group(env, keys.POLICY, algo),
              "action_dim": env.action_dim}
    return typed(cls, values, f"algo.{section}")


def _critic_key(env: VecEnv) -> str:
    return keys.CRITIC if keys.CRITIC in env.obs_spec.shapes else keys.POLICY


def build_ppo(algo_raw: dict[str, Any], env: VecEnv, device: torch.device) -> PPO:
    """PPO with a Gaussian actor on the ``policy`` group and an MLP critic on ``critic`` (else ``policy``)."""
    algo_raw = dict(algo_raw)
    critic_key = _critic_key(env)
    policy_cfg = _actor_config(GaussianPolicyConfig, algo_raw, "policy", env, "ppo")
    critic_cfg = typed(CriticConfig, {**algo_raw.pop("critic", {}), "obs_dim": _flat_group(env, critic_key, "ppo"),
                                      "obs_key": critic_key}, "algo.critic")
    return PPO(GaussianPolicy(policy_cfg), MLPCritic(critic_cfg), typed(PPOConfig, algo_raw, "algo"), device)


def build_flashsac(algo_raw: dict[str, Any], env: VecEnv, device: torch.device) -> FlashSAC:
    """FlashSAC with a tanh-Gaussian actor on ``policy`` and the critics on ``critic`` (else ``policy``)."""
    algo_raw = dict(algo_raw)
    critic_key = _critic_key(env)
    actor_cfg = _actor_config(TanhGaussianPolicyConfig, algo_raw, "actor", env, "flashsac")
    critic_raw = algo_raw.pop("critic", {})
    cfg = typed(FlashSACConfig, algo_raw, "algo")
    critic_cfg = typed(CategoricalQConfig, {**critic_raw, "obs_dim": _flat_group(env, critic_key, "flashsac"),
                                            "action_dim": env.action_dim, "obs_key": critic_key,
                                            "num_bins": cfg.num_bins, "v_min": cfg.v_min, "v_max": cfg.v_max},
                       "algo.critic")
    return FlashSAC(TanhGaussianPolicy(actor_cfg), CategoricalQ(critic_cfg), cfg, env.num_envs, device)


@dataclass(frozen=True)
class AlgorithmEntry:
    """How ``algo=<name>`` is built and driven.

    ``runner_keys`` are the keys of the algo config that belong to the runner's config (``runner_config``), e.g.
    PPO's rollout length; the rest go to ``build``.
    """

    build: Callable[[dict[str, Any], VecEnv, torch.device], Algorithm]
    runner: type
    runner_config: type
    runner_keys: tuple[str, ...] = ()


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "ppo": AlgorithmEntry(build_ppo, OnPolicyRunner, OnPolicyRunnerConfig, ("num_steps",)),
    "flashsac": AlgorithmEntry(build_flashsac, OffPolicyRunner, OffPolicyRunnerConfig,
                               ("steps_per_iteration", "save_replay")),
}


def algorithm_entry(name: str) -> AlgorithmEntry:
    if name not in ALGORITHMS:
        raise ValueError(f"bad config: algo={name!r}; allowed: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def build_algorithm(name: str, algo_raw: dict[str, Any], env: VecEnv,
                    device: torch.device | str = "cpu") -> tuple[Algorithm, dict[str, Any]]:
    """The learner ``algo=<name>`` from its config (a plain dict, ``name`` excluded) and the runner's keys."""
    entry = algorithm_entry(name)
    learner_raw = {k: v for k, v in algo_raw.items() if k not in entry.runner_keys}
    runner_keys = {k: algo_raw[k] for k in entry.runner_keys if k in algo_raw}
    return entry.build(learner_raw, env, torch.device(device)), runner_keys


def build_runner(name: str, env: VecEnv, algo: Algorithm, runner_keys: dict[str, Any], limits: RunLimits,
                 logger: RunLogger, checkpoints: CheckpointManager | None, meta: dict[str, Any],
                 demo: ReplayBuffer | None = None, update_threads: int | None = None,
                 hil: InterventionAgent | None = None) -> Any:
    """The runner that drives ``algo=<name>``: its config is the run's limits plus the algo config's runner keys.
    ``demo``: a demonstration buffer mixed into every batch, ``hil``: an intervention agent (``build_hil``; both
    for off-policy learners only). ``update_threads``: torch's threads while an on-policy learner updates (None: as
    they are; off-policy runners interleave updates with env steps and ignore it)."""
    entry = algorithm_entry(name)
    shared = {f.name: getattr(limits, f.name) for f in dataclasses.fields(RunLimits)}
    if update_threads is not None and any(f.name == "update_threads" for f in dataclasses.fields(entry.runner_config)):
        shared["update_threads"] = update_threads
    cfg = typed(entry.runner_config, {**shared, **runner_keys}, "algo")
    extra = {k: v for k, v in (("demo", demo), ("hil", hil)) if v is not None}
    return entry.runner(env, algo, cfg, logger, checkpoints, meta, **extra)


def build_hil(settings: HilSettings, algo_name: str | None, env: VecEnv, seed: int = 0) -> InterventionAgent | None:
    """The intervention agent of ``hil.*`` (None when ``hil.person`` is unset): the task's scripted expert playing
    the person (its flaws below quality 1 drawn from ``seed``), stepping in as ``hil.judge`` says (``ActionGap`` or
    ``Deadline``). ``algo_name`` None: a remote actor's (its learner is off-policy, checked there).

    Raises:
        ValueError: ``algo`` is not off-policy, or the task has no scripted expert.
    """
    if settings.person is None:
        if settings != HilSettings():
            print("warning: hil.* settings do nothing without hil.person=expert (nobody takes over)", file=sys.stderr)
        return None
    if algo_name is not None and algorithm_entry(algo_name).runner is not OffPolicyRunner:
        raise ValueError(f"hil.person is for off-policy learners (algo=flashsac): a person's actions are off-policy "
                         f"data, which algo={algo_name} cannot learn from")
    from robot_rl.hil import ActionGap, Deadline
    from sim.experts import make_expert

    expert = make_expert(env, quality=settings.quality, seed=seed)
    n = env.num_envs
    judge = (Deadline(settings.after, n) if settings.judge == "deadline"
             else ActionGap(settings.gap, settings.patience, settings.hold, n))
    return InterventionAgent(expert, judge, n, watch=settings.judge == "gap")


def target_to_env_action(env: VecEnv) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """For an SO-101 task env: (``observation.state`` [M, 6] degrees, ``action`` [M, 6] degree targets) -> the env's
    actions [M, 6], ``SO101Arm.ctrl_to_action(measured q, target)`` as ``sim.lerobot_view`` steps them (here the
    measured q is the recorded state); None for other envs."""
    arm = getattr(getattr(env, "task", None), "arm", None)
    if arm is None or not hasattr(arm, "ctrl_to_action"):
        return None
    from sim.so101 import deg_to_rad

    def convert(state: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return arm.ctrl_to_action(deg_to_rad(state).to(env.device), deg_to_rad(target).to(env.device)).cpu()

    return convert


def build_demo_buffer(settings: DemoDatasetSettings, algo_name: str, env: VecEnv, algo: Algorithm, task_cfg: Any,
                      device: torch.device) -> ReplayBuffer | None:
    """The demonstration buffer of ``demo_dataset.root`` (None when unset), in the env's terms: the groups the
    learner reads, its action size, its time limit and whether success ends its episodes; for a dataset recorded
    without ``env_action``, LeRobot's degree targets converted with the SO-101's ``ctrl_to_action`` (from the
    recorded joints: approximate where the observation was noisy). Prints what went in.

    Raises:
        ValueError: ``algo`` is not off-policy; DatasetError (a ValueError): the dataset does not fit the env.
    """
    if settings.root is None:
        return None
    if algorithm_entry(algo_name).runner is not OffPolicyRunner:
        raise ValueError(f"demo_dataset.root is for off-policy learners (algo=flashsac), not algo={algo_name}")
    from robot_rl.data.demo_buffer import EpisodeEnds, load_demo_buffer

    obs_dims = {g: _flat_group(env, g, algo_name) for g in algo.obs_groups}
    ends = EpisodeEnds(env.max_episode_length, bool(getattr(task_cfg, "terminate_on_success", True)))
    buffer, tr = load_demo_buffer(settings.root, obs_dims, env.action_dim, ends, device, target_to_env_action(env),
                                  settings.max_episodes, settings.timing_check)
    print(f"demo buffer: {len(tr)} transitions from {tr.num_episodes} episodes ({tr.num_successes} successful) of "
          f"{settings.root}; actions from {tr.action_source}", file=sys.stderr)
    return buffer


# --------------------------------------------------------------------------------------------------- envs
def build_shaping(settings: RewardSettings, env: VecEnv, gamma: float | None, demo: Any = None,
                  learner: str = "the learner") -> VecEnv:
    """``env`` with dense rewards (``reward.progress``: ``robot_rl.rewards.ShapedEnv`` over a progress model, at the
    learner's discount ``gamma``), or ``env`` itself; refuses a model that reads another observation than the env's
    (``learner`` names the learner in the error when it has no discount)."""
    if settings.progress is None:
        return env
    from robot_rl.rewards import ShapedEnv
    from robot_rl.rewards.progress import load_progress

    if demo is not None:
        raise ValueError("reward.progress with demo_dataset.root: the demos' rewards are not shaped, so the two would "
                         "teach different returns; use one of them")
    model = load_progress(settings.progress, env.device)
    size = env.obs_spec.shapes.get(keys.POLICY)
    if size is None or tuple(size) != (model.obs_dim,):
        raise ValueError(f"the progress model at {settings.progress} reads {model.obs_dim} values of the env's "
                         f"{keys.POLICY!r} observation, this env gives {None if size is None else list(size)}: train it "
                         f"on this task's demos (`robot-rl collect task=<task> env_state=true`)")
    several = len(model.tasks) > 1
    if several:
        model.task_index(list(env.instructions))  # an instruction it never saw: refused now, naming it
    if gamma is None:
        raise ValueError(f"reward.progress shapes at the learner's discount, and {learner} has none")
    return ShapedEnv(env, model.potential, gamma=float(gamma), scale=settings.scale, reads_instructions=several)


def build_env(task_raw: dict[str, Any], sim_raw: dict[str, Any]) -> VecEnv:
    """The env of a composed ``task`` and ``sim`` config (plain dicts; ``task.name`` picks the task)."""
    from sim.registry import config_from_dict, make_env, sim_config_from_dict

    task_raw = dict(task_raw)
    name = task_raw.pop("name")
    return make_env(name, sim_config_from_dict(sim_raw), config_from_dict(name, task_raw))


def reads_lerobot_frames(policy: Any) -> bool:
    """True for a policy that reads LeRobot's frames (observation.state in degrees, observation.images.<cam>,
    task text) rather than the simulator's observation groups: the flow VLA, LeRobot's own policies."""
    feats = getattr(getattr(policy, "processor", None), "features", None)
    return feats is not None and keys.OBS_STATE in feats.inputs


def policy_view(env: VecEnv, policy: Any) -> VecEnv:
    """``env`` as ``policy`` sees it: an SO-101 task env in LeRobot's frames (``sim.lerobot_view.LeRobotView``,
    rendering the policy's cameras at its image size) for a policy that reads them, else ``env`` itself."""
    if not reads_lerobot_frames(policy):
        return env
    from sim.lerobot_view import LeRobotView

    inputs = policy.processor.features.inputs
    cams = [k[len(keys.OBS_IMAGES):] for k in inputs if k.startswith(keys.OBS_IMAGES)]
    size = tuple(inputs[keys.lerobot_image_key(cams[0])][-2:]) if cams else (64, 64)
    try:
        return LeRobotView(env, cameras=cams, image_size=size)
    except TypeError as e:  # a task of another robot: a setting to change, not a crash
        raise ValueError(f"this policy reads an SO-101's LeRobot frames (joints in degrees, cameras {cams}), which "
                         f"only the SO-101 tasks give: {e}") from e


# ---------------------------------------------------------------------------------------------------- run
@dataclass
class Training:
    """A built run of ``robot-rl train``: everything ``runner.learn()`` and the final report need."""

    config: dict[str, Any]  # the resolved composed config
    settings: TrainSettings
    checkpoint_settings: CheckpointSettings
    eval_settings: EvalSettings
    task_name: str
    task_cfg: Any
    sim_cfg: Any
    device: torch.device
    env: VecEnv
    algo: Algorithm
    runner: Any
    logger: RunLogger | SilentLogger
    run_dir: Path
    group: ProcessGroup | None = None  # data-parallel ranks under torchrun (robot_rl.distributed); None: alone

    @property
    def main(self) -> bool:
        """The process that writes the run folder, logs and evaluates (rank 0, or the only one)."""
        return self.group is None or self.group.main

    def close(self) -> None:
        self.logger.close()
        self.env.close()
        if self.group is not None:
            self.group.close()


def build_training(cfg: Any) -> Training:
    """Build (and, with ``resume=``, restore) a training run from a composed ``train`` config.

    Seeds the global generators, sets torch's threads, refuses to resume onto another setup, removes partial
    checkpoint writes before anything else is written, and writes ``config.yaml`` into the run folder.
    """
    from omegaconf import OmegaConf

    from robot_rl.checkpoint import CHECKPOINTS_DIR, check_new_run_dir, remove_partial_writes
    from sim.registry import ISAACLAB, config_from_dict, make_env, sim_config_from_dict

    full = OmegaConf.to_container(cfg, resolve=True)
    raw = json.loads(json.dumps(full))
    task_raw, algo_raw, sim_raw = raw.pop("task"), raw.pop("algo"), raw.pop("sim")
    ckpt_s = typed(CheckpointSettings, raw.pop("checkpoint"), "checkpoint")  # keep_last
    eval_s = typed(EvalSettings, raw.pop("eval"), "eval")
    log_s = typed(LoggerConfig, raw.pop("logger"), "logger")
    demo_s = typed(DemoDatasetSettings, raw.pop("demo_dataset"), "demo_dataset")
    hil_s = typed(HilSettings, raw.pop("hil"), "hil")
    reward_s = typed(RewardSettings, raw.pop("reward"), "reward")
    remote_s = typed(RemoteSettings, raw.pop("remote"), "remote")
    s = typed(TrainSettings, raw, "")
    group = from_environment(resolve_device(s.device))  # under torchrun: this process's rank (None alone)
    if remote_s.listen is not None:
        check_remote_learner(group, hil_s, reward_s, algo_raw.get("name"))
    device = rank_device(resolve_device(s.device), group)
    main = group is None or group.main  # the process that writes the run folder, logs and evaluates
    task_name, algo_name = task_raw.pop("name"), algo_raw.pop("name")
    algorithm_entry(algo_name)
    seed_everything(s.seed)
    torch.set_num_threads(s.torch_threads)
    if s.deterministic:
        torch.use_deterministic_algorithms(True)
    if group is not None:  # each process simulates on its own GPU too
        sim_raw["device"] = str(rank_device(sim_raw.get("device", "cpu"), group))
    task_cfg, sim_cfg = config_from_dict(task_name, task_raw), sim_config_from_dict(sim_raw)
    if s.resume and sim_cfg.backend == ISAACLAB:  # IsaacLabVecEnv.load_state_dict refuses: no simulation state saved
        raise ValueError("cannot resume a sim=isaaclab run: Isaac Lab's simulation state is not checkpointed, so it "
                         "cannot continue exactly; start a new run (`robot-rl eval checkpoint=...` loads its policy)")
    ckpt = load_checkpoint(s.resume) if s.resume else None
    if ckpt is not None:
        run_dir = Path(s.run_dir) if s.run_dir else ckpt.path.parent.parent
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
        run_dir = Path(s.run_dir or f"runs/{task_name}_{algo_name}_{stamp}")
        if group is not None:  # rank 0's clock names the folder
            run_dir = Path(group.broadcast_text(str(run_dir)))
        if main:
            check_new_run_dir(run_dir)
    env = make_env(task_name, sim_cfg, task_cfg)
    algo, runner_keys = build_algorithm(algo_name, algo_raw, env, device)
    if group is not None:  # rank 0's weights everywhere; then each rank its own random stream and env seeds, and
        algo.distribute(group)  # its share of the success window, so the pooled window is the run's last episodes
        seed_everything(s.seed + group.rank)
        s = dataclasses.replace(s, seed=s.seed + group.rank,
                                success_window=-(-s.success_window // group.world_size))
    unread = [g for g in env.obs_spec.shapes if g.startswith(keys.IMAGE_PREFIX) and g not in algo.obs_groups]
    if unread:  # rendering is most of a step's cost on the CPU: say so rather than pay it silently
        print(f"warning: task.cameras renders {unread} every step, which {algo_name} does not read (it reads "
              f"{algo.obs_groups}); drop task.cameras to train without the rendering cost", file=sys.stderr)
    demo = build_demo_buffer(demo_s, algo_name, env, algo, task_cfg, device)  # before any write: a bad one fails here
    hil = build_hil(hil_s, algo_name, env, s.seed)
    env = build_shaping(reward_s, env, getattr(getattr(algo, "cfg", None), "gamma", None), demo, type(algo).__name__)
    meta = {"task": task_name, "algo": algo_name, "obs_spec": env.obs_spec.to_json(), "action_dim": env.action_dim,
            "task_config": dataclasses.asdict(task_cfg), "config": full}
    if group is not None:
        meta["world_size"] = group.world_size
    if remote_s.listen is not None:
        meta["remote_actors"] = remote_s.actors
    if ckpt is not None:  # another task or algorithm first, then what else cannot continue (nothing written yet)
        check_resume_compatible(ckpt.meta, meta)
        check_world_size(int(ckpt.meta.get("world_size", 1)), 1 if group is None else group.world_size, ckpt.path)
        check_remote_resume(ckpt.meta.get("remote_actors"), meta.get("remote_actors"), ckpt.path)
        check_resume_point(ckpt.path, run_dir, ckpt.meta.get("config", {}), sim_cfg.num_envs)
        if main:
            _warn_changed(ckpt.meta.get("config", {}), full)
    start_steps = int(ckpt.meta.get("env_steps", 0)) if ckpt is not None else 0
    logger: RunLogger | SilentLogger = SilentLogger()
    checkpoints = None
    if main:
        remove_partial_writes(run_dir / CHECKPOINTS_DIR)  # first: a half-written checkpoint may hold the space needed
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        logger = RunLogger(run_dir, log_s, s.total_steps, start_steps, config=full)
        checkpoints = CheckpointManager(run_dir / CHECKPOINTS_DIR, ckpt_s.keep_last)
    # the machine's cores shared among the ranks it runs (torchrun's LOCAL_WORLD_SIZE)
    cores = max(1, available_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    update_threads = s.update_threads if s.update_threads is not None else cores
    threads = max(s.torch_threads, update_threads if algorithm_entry(algo_name).runner is OnPolicyRunner else 1)
    if threads > 1:  # other work on the machine can make torch's threads a slowdown: say so (robot_rl.cli.load)
        warning = thread_warning(threads, cores, other_load(0.1)) if main else None
        if warning:
            print(warning, file=sys.stderr)
    if remote_s.listen is not None:  # a learner fed by remote actors (robot_rl.remote)
        from robot_rl.remote.learner import RemoteLearnerRunner

        shared = {f.name: getattr(s, f.name) for f in dataclasses.fields(RunLimits)}
        runner = RemoteLearnerRunner(env, algo, typed(OffPolicyRunnerConfig, {**shared, **runner_keys}, "algo"),
                                     logger, checkpoints, meta, remote_s, run_dir, demo)
    else:
        runner = build_runner(algo_name, env, algo, runner_keys, s, logger, checkpoints, meta, demo, update_threads,
                              hil)
    runner.group = group
    if ckpt is not None:
        runner.restore(ckpt)
        logger.truncate_curve(runner.iteration)
        if main:
            print(f"resumed from {ckpt.path} at iteration {runner.iteration} ({runner.env_steps} env steps)",
                  file=sys.stderr)
    else:  # the points of a run that stopped here before its first checkpoint are not this run's
        logger.truncate_curve(0)
    return Training(full, s, ckpt_s, eval_s, task_name, task_cfg, sim_cfg, device, env, algo, runner, logger,
                    run_dir, group)


def check_remote_learner(group: ProcessGroup | None, hil: HilSettings, reward: RewardSettings,
                         algo: str | None) -> None:
    """What a learner fed by remote actors does not combine with, refused before anything is built."""
    if algorithm_entry(str(algo)).runner is not OffPolicyRunner:
        raise ValueError(f"remote.listen: remote actors feed an off-policy learner (algo=flashsac); algo={algo} "
                         "learns from its own current policy's rollouts")
    if group is not None:
        raise ValueError("remote.listen does not combine with torchrun (data-parallel): one learner process serves "
                         "the actors")
    # (demo_dataset.root combines: the demos stay with the learner, mixed into its batches as in one process)
    if hil.person is not None:
        raise ValueError("hil.person goes on the actors, where the envs are: robot-rl actor ... hil.person=expert "
                         "(hil.judge, hil.after there too); the learner mixes the transitions they drove into RLPD's "
                         "offline half by itself")
    if reward.progress is not None:
        raise ValueError("reward.progress goes on the actors, where the envs are: robot-rl actor ... "
                         "reward.progress=<model> (they shape at this learner's discount, which it tells them)")


def check_remote_resume(was: Any, now: Any, path: Path) -> None:
    """A remote learner resumes only as one with the same actor slots; an in-process run only as one."""
    if was != now:
        def what(x: Any) -> str:
            return "an in-process run" if x is None else f"a remote learner of {x} actor slots (remote.actors)"

        raise ResumeMismatchError(f"{path} was written by {what(was)}; this run is {what(now)}: resume it as it "
                                  "was started")


def check_resume_point(path: Path, run_dir: Path, config: dict[str, Any], num_envs: int) -> None:
    """Before anything is written: a resume continues the run's own envs (their state, buffers and noise
    are per env), so sim.num_envs must be the run's; and in the run's own folder it continues from the latest
    checkpoint (an earlier one would rewind the run in place: its later checkpoints and curve dropped or mixed).

    Raises:
        ValueError: naming the setting to repeat, or the ways to resume.
    """
    from robot_rl.checkpoint import resolve_checkpoint

    was = config.get("sim", {}).get("num_envs")
    if was is not None and int(was) != num_envs:
        raise ValueError(f"the run at {path} has sim.num_envs={was}; this resume asks {num_envs}: give "
                         f"sim.num_envs={was} (a resume rebuilds settings from the command line, and each env's "
                         f"state is in the checkpoint)")
    if run_dir.resolve() == path.parent.parent.resolve():
        latest = resolve_checkpoint(run_dir)
        if latest.resolve() != path.resolve():
            raise ValueError(f"{path.name} is not the latest checkpoint of {run_dir} ({latest.name}): resuming it in "
                             f"place would rewind the run; resume={run_dir} continues it, or resume={path} "
                             f"run_dir=<new folder> branches from {path.name}")


def _warn_changed(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Resuming with other settings (cadence, budget, hyperparameters) is allowed but said out loud."""
    changed = changed_settings(old, new, ("resume", "run_dir"))
    if changed:
        print(f"warning: resuming with changed settings: {', '.join(changed)}", file=sys.stderr)
