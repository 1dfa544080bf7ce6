"""``robot-rl``: the command line, the one place that wires simulators, policies and learners together.

    robot-rl train task=so101_reach algo=ppo sim=mujoco [key=value ...]
    robot-rl train sim=isaaclab task=isaaclab task.id=Isaac-Cartpole algo=ppo device=cuda   (Isaac Lab installed)
    robot-rl train ... resume=runs/so101_reach_ppo_20250101_120000
    robot-rl eval checkpoint=runs/so101_reach_ppo_20250101_120000 [num_episodes=100]

Configs are Hydra YAML in the top-level ``configs/`` folder (train.yaml, eval.yaml, algo/, task/, sim/).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
USAGE = """usage: robot-rl <command> [key=value ...]

commands:
  train   train a policy:   robot-rl train task=so101_reach algo=ppo|flashsac sim=mujoco [total_steps=...] [resume=PATH]
                            robot-rl train sim=isaaclab task=isaaclab task.id=Isaac-Cartpole algo=ppo|flashsac
  eval    evaluate / film:  robot-rl eval checkpoint=PATH [num_episodes=100]

Options are Hydra overrides of the YAML files in {config_dir}."""


def _compose(name: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _build_ppo(algo_raw: dict[str, Any], env: Any, device: Any) -> tuple[Any, int]:
    """PPO with a Gaussian actor on the ``policy`` group and an MLP critic on ``critic`` (else ``policy``)."""
    from policies import keys
    from policies.gaussian import GaussianPolicy, GaussianPolicyConfig
    from robot_rl.algos.ppo import PPO, PPOConfig
    from robot_rl.cli.config import typed
    from robot_rl.models.critics import CriticConfig, MLPCritic

    shapes = env.obs_spec.shapes
    critic_key = keys.CRITIC if keys.CRITIC in shapes else keys.POLICY
    for k in (keys.POLICY, critic_key):
        if len(shapes[k]) != 1:
            raise ValueError(f"algo=ppo needs a flat '{k}' observation, the env gives shape {shapes[k]}")
    num_steps = int(algo_raw.pop("num_steps"))
    policy_cfg = typed(GaussianPolicyConfig, {**algo_raw.pop("policy"), "obs_dim": shapes[keys.POLICY][0],
                                              "action_dim": env.action_dim}, "algo.policy")
    critic_cfg = typed(CriticConfig, {**algo_raw.pop("critic"), "obs_dim": shapes[critic_key][0],
                                      "obs_key": critic_key}, "algo.critic")
    ppo_cfg = typed(PPOConfig, algo_raw, "algo")
    return PPO(GaussianPolicy(policy_cfg), MLPCritic(critic_cfg), ppo_cfg, device), num_steps


def _build_flashsac(algo_raw: dict[str, Any], env: Any, device: Any) -> tuple[Any, dict[str, Any]]:
    """FlashSAC and the off-policy runner's keys (robot_rl/cli/offpolicy.py)."""
    from robot_rl.cli.offpolicy import build_flashsac

    return build_flashsac(algo_raw, env, device)


ALGOS = {"ppo": _build_ppo, "flashsac": _build_flashsac}


def _report(out_dir: Path, policy: Any, task_name: str, task_cfg: Any, sim_cfg: Any, ev: Any, device: Any,
            curve_dir: Path, extra: dict[str, Any], env: Any = None) -> dict[str, Any]:
    """Seeded evaluation, an mp4 from a camera and the learning-curve PNG, all written into ``out_dir``.

    ``env``: an open env to evaluate on (Isaac Lab: one simulation per process); None: one of ``ev.num_envs`` envs.
    """
    import torch

    from robot_rl.evaluation import evaluate, record_video
    from robot_rl.logging import CURVE_PNG, plot_learning_curve, read_curve
    from robot_rl.runners.common import to_device
    from sim.registry import ISAACLAB, make_env

    out_dir.mkdir(parents=True, exist_ok=True)
    policy.eval()

    def act(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return policy.act(to_device(obs, device), deterministic=True)

    result: dict[str, Any] = dict(extra)
    if env is not None:
        result["eval"] = evaluate(env, act, ev.num_episodes, ev.seed).to_json()
    else:
        with make_env(task_name, dataclasses.replace(sim_cfg, num_envs=ev.num_envs), task_cfg) as eval_env:
            result["eval"] = evaluate(eval_env, act, ev.num_episodes, ev.seed).to_json()
    if ev.video and sim_cfg.backend == ISAACLAB:
        result["video"] = None
        print("eval: no video: the Isaac Lab adapter does not render (eval.video=false skips this message)",
              file=sys.stderr)
    elif ev.video:
        with make_env(task_name, dataclasses.replace(sim_cfg, num_envs=1, num_threads=1), task_cfg) as video_env:
            video = record_video(video_env, act, out_dir / "policy.mp4", ev.seed, ev.video_episodes, ev.camera,
                                 ev.width, ev.height)
            result["video"] = None if video is None else str(video)  # None: not written (warned)
    points = read_curve(curve_dir)
    if points:
        png = plot_learning_curve(points, out_dir / CURVE_PNG, title=f"{task_name}")
        result["curve"] = None if png is None else str(png)
        for thr in (0.5, 0.9):
            hit = next((p for p in points if (p.get("success_rate") or 0.0) >= thr), None)
            result[f"time_to_success_{int(thr * 100)}"] = (
                None if hit is None else {"wall_s": hit["wall_s"], "env_steps": hit["env_steps"]})
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2))
    e = result["eval"]
    print(f"eval: success rate {e['success_rate']:.3f}, mean return {e['mean_return']:.3f} over "
          f"{e['num_episodes']} episodes; results in {out_dir}", file=sys.stderr)
    return result


def train(cfg: Any) -> Path:
    """``robot-rl train``: build, (resume,) learn, then evaluate, film and plot into the run folder."""
    import torch
    from omegaconf import OmegaConf

    from robot_rl.checkpoint import (
        CHECKPOINTS_DIR,
        CheckpointManager,
        check_resume_compatible,
        load_checkpoint,
        remove_partial_writes,
    )
    from robot_rl.cli.config import CheckpointSettings, EvalSettings, TrainSettings, resolve_device, typed
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig
    from sim.registry import ISAACLAB, config_from_dict, make_env, sim_config_from_dict

    full = OmegaConf.to_container(cfg, resolve=True)
    raw = json.loads(json.dumps(full))
    task_raw, algo_raw, sim_raw = raw.pop("task"), raw.pop("algo"), raw.pop("sim")
    ckpt_s = typed(CheckpointSettings, raw.pop("checkpoint"), "checkpoint")
    eval_s = typed(EvalSettings, raw.pop("eval"), "eval")
    log_s = typed(LoggerConfig, raw.pop("logger"), "logger")
    s = typed(TrainSettings, raw, "")
    device = resolve_device(s.device)
    task_name, algo_name = task_raw.pop("name"), algo_raw.pop("name")
    if algo_name not in ALGOS:
        raise ValueError(f"bad config: algo={algo_name!r}; allowed: {sorted(ALGOS)}")
    _seed_everything(s.seed)
    torch.set_num_threads(s.torch_threads)
    if s.deterministic:
        torch.use_deterministic_algorithms(True)
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
    env = make_env(task_name, sim_cfg, task_cfg)
    algo, num_steps = ALGOS[algo_name](algo_raw, env, device)
    meta = {"task": task_name, "algo": algo_name, "obs_spec": env.obs_spec.to_json(), "action_dim": env.action_dim,
            "task_config": dataclasses.asdict(task_cfg), "config": full}
    if ckpt is not None:
        check_resume_compatible(ckpt.meta, meta)
        _warn_changed(ckpt.meta.get("config", {}), full)
    remove_partial_writes(run_dir / CHECKPOINTS_DIR)  # first: a half-written checkpoint may hold the space needed
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    start_steps = int(ckpt.meta.get("env_steps", 0)) if ckpt is not None else 0
    logger = RunLogger(run_dir, log_s, s.total_steps, start_steps, config=full)
    if algo_name == "flashsac":  # off-policy: num_steps holds the runner's keys of configs/algo/flashsac.yaml
        from robot_rl.cli.offpolicy import make_off_policy_runner

        runner = make_off_policy_runner(env, algo, num_steps, s, ckpt_s.every, logger,
                                        CheckpointManager(run_dir / "checkpoints", ckpt_s.keep_last), meta)
    else:
        runner_cfg = OnPolicyRunnerConfig(num_steps=num_steps, total_steps=s.total_steps, max_minutes=s.max_minutes,
                                          checkpoint_every=ckpt_s.every, stop_success_rate=s.stop_success_rate,
                                          success_window=s.success_window, seed=s.seed)
        runner = OnPolicyRunner(env, algo, runner_cfg, logger, CheckpointManager(run_dir / "checkpoints",
                                                                                 ckpt_s.keep_last), meta)
    if ckpt is not None:
        runner.restore(ckpt)
        logger.truncate_curve(runner.iteration)
        print(f"resumed from {ckpt.path} at iteration {runner.iteration} ({runner.env_steps} env steps)",
              file=sys.stderr)
    with env:  # closed after the evaluation, which runs on it for Isaac Lab (one simulation per process)
        try:
            runner.learn()
        finally:
            logger.close()
        print(f"trained {runner.env_steps} env steps in {runner.elapsed_s:.1f} s; run folder {run_dir}",
              file=sys.stderr)
        if eval_s.enabled:
            extra = {"checkpoint": str(runner.checkpoints.latest()), "env_steps": runner.env_steps,
                     "train_wall_s": runner.elapsed_s}
            _report(run_dir, algo.policy, task_name, task_cfg, sim_cfg, eval_s, device, run_dir, extra,
                    env if sim_cfg.backend == ISAACLAB else None)
    return run_dir


def _warn_changed(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Resuming with other settings (cadence, budget, hyperparameters) is allowed but said out loud."""
    def flat(d: Any, p: str = "") -> dict[str, Any]:
        if not isinstance(d, dict):
            return {p: d}
        return {k: v for key, val in d.items() for k, v in flat(val, f"{p}.{key}" if p else key).items()}

    a, b = flat(old), flat(new)
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in ("resume", "run_dir"))
    if changed:
        print(f"warning: resuming with changed settings: {', '.join(changed)}", file=sys.stderr)


def evaluate_checkpoint(cfg: Any) -> dict[str, Any]:
    """``robot-rl eval``: load the exported policy of a checkpoint (no algorithm code) and report on it."""
    import torch
    from omegaconf import OmegaConf

    from policies import load_policy
    from robot_rl.checkpoint import POLICY_DIR, load_meta
    from robot_rl.cli.config import EvalCommand, resolve_device, typed
    from sim.registry import config_from_dict, sim_config_from_dict

    e = typed(EvalCommand, OmegaConf.to_container(cfg, resolve=True), "")
    device = resolve_device(e.device)
    torch.set_num_threads(1)
    folder, meta = load_meta(e.checkpoint)
    policy = load_policy(folder / POLICY_DIR, device)
    task_cfg = config_from_dict(meta["task"], meta["task_config"])
    sim_raw = dict(meta["config"]["sim"], num_envs=e.num_envs, num_threads=e.num_threads, device="cpu")
    sim_cfg = sim_config_from_dict(sim_raw)
    run_dir = folder.parent.parent
    out_dir = Path(e.out_dir) if e.out_dir else run_dir / f"eval_{folder.name}"
    ev = dataclasses.replace(e, checkpoint=str(folder))
    extra = {"checkpoint": str(folder), "env_steps": meta.get("env_steps"), "iteration": meta.get("iteration")}
    return _report(out_dir, policy, meta["task"], task_cfg, sim_cfg, ev, device, run_dir, extra)


COMMANDS = {"train": train, "eval": evaluate_checkpoint}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``robot-rl`` console script. Returns the exit status: 2 for a bad config, checkpoint or
    policy file (every ``MalformedFileError``), 3 when training stopped on non-finite updates, 4 when a write failed
    (no space left, a read-only disk: ``OutputWriteError`` names the file and the checkpoint to resume from)."""
    from hydra.errors import HydraException

    from policies.safetensors_check import MalformedFileError
    from robot_rl.algos.guard import NonFiniteError
    from robot_rl.checkpoint import OutputWriteError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.format(config_dir=CONFIG_DIR))
        return 0
    cmd, overrides = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"robot-rl: unknown command {cmd!r}; allowed: {sorted(COMMANDS)}\n\n" + USAGE.format(
            config_dir=CONFIG_DIR), file=sys.stderr)
        return 2
    os.environ.setdefault("MUJOCO_GL", "egl")  # offscreen rendering for videos on machines without a display
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        COMMANDS[cmd](_compose(cmd, overrides))
    except (HydraException, ValueError, FileNotFoundError, MalformedFileError) as err:
        print(f"robot-rl {cmd}: error: {err}", file=sys.stderr)
        return 2
    except NonFiniteError as err:
        print(f"robot-rl {cmd}: stopped: {err}", file=sys.stderr)
        return 3
    except (OutputWriteError, OSError) as err:  # OSError: a write outside the runner (config.yaml, eval.json)
        print(f"robot-rl {cmd}: stopped: {err}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
