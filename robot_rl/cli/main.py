"""``robot-rl``: the command line, the one place that wires simulators, policies and learners together.

    robot-rl train task=so101_reach algo=ppo sim=mujoco [key=value ...]
    robot-rl train sim=isaaclab task=isaaclab task.id=Isaac-Cartpole algo=ppo device=cuda   (Isaac Lab installed)
    robot-rl train ... resume=runs/so101_reach_ppo_20250101_120000
    robot-rl eval checkpoint=runs/so101_reach_ppo_20250101_120000 [num_episodes=100]

Configs are Hydra YAML in the top-level ``configs/`` folder (train.yaml, eval.yaml, algo/, task/, sim/).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

USAGE = """usage: robot-rl <command> [key=value ...]

commands:
  train   train a policy:   robot-rl train task=so101_reach algo=ppo|flashsac sim=mujoco [total_steps=...] [resume=PATH]
                            robot-rl train sim=isaaclab task=isaaclab task.id=Isaac-Cartpole algo=ppo|flashsac
                            data-parallel: torchrun --standalone --nproc-per-node P -m robot_rl.cli.main train ...
                            a learner for remote actors: robot-rl train algo=flashsac remote.listen=HOST:PORT remote.actors=K
  actor   act for a learner: robot-rl actor task=TASK remote.address=HOST:PORT remote.actor_id=I remote.token_file=F
  collect record episodes:  robot-rl collect task=so101_pick episodes=N dataset.root=DIR [policy=PATH] [quality=1.0]
  eval    evaluate / film:  robot-rl eval checkpoint=PATH [num_episodes=100] [task=TASK (an offline run's)]
  offline train on logged data: robot-rl offline algo=bc|recap|awr dataset.root=DIR [steps=N] [max_minutes=M] [resume=PATH]
  deploy  run a policy on an arm: robot-rl deploy robot=so101|so101_sim checkpoint=PATH [episodes=N] [dataset.root=DIR]
                            [teleop=so101_leader takeover=keyboard]
  record  teleoperated demos: robot-rl record robot=so101|so101_sim teleop=so101_leader|so101_sim_leader
                            dataset.root=DIR episodes=N
  progress progress model (dense rewards): robot-rl progress dataset.root=DIR [run_dir=DIR] [steps=N]
  success success classifier: robot-rl success dataset.root=DIR [run_dir=DIR] [steps=N]
                            label a copy with it: robot-rl success dataset.root=SRC label.model=RUN label.out=NEW_DIR
  recap   improvement loop: robot-rl recap task=so101_lift rounds=K [run_dir=DIR] [episodes_per_round=N] [steps=N]

Options are Hydra overrides of the YAML files in {config_dir}.
robot-rl <command> --help prints the command's whole config (with any overrides given), every key it takes."""

HELP_FLAGS = ("-h", "--help")


def command_help(cmd: str, cfg: Any) -> str:
    """``robot-rl <cmd> --help``: the command's lines of the usage, then its composed config as YAML."""
    from omegaconf import OmegaConf

    lines, own = [], False
    for line in USAGE.splitlines()[3:]:  # the command table
        if line.startswith("  ") and not line.startswith("   "):  # a command's first line
            own = line.split()[0] == cmd
        elif not line.strip():
            break
        if own:
            lines.append(line)
    return "\n".join([f"usage: robot-rl {cmd} [key=value ...]", *lines, "",
                      "its config (every key can be overridden as key=value; a misspelled key is refused):", "",
                      OmegaConf.to_yaml(cfg)])


def _report(out_dir: Path, policy: Any, task_name: str, task_cfg: Any, sim_cfg: Any, ev: Any, device: Any,
            curve_dir: Path, extra: dict[str, Any], env: Any = None) -> dict[str, Any]:
    """Seeded evaluation, an mp4 from a camera and the learning-curve PNG, all written into ``out_dir``.

    ``env``: an open env to evaluate on (Isaac Lab: one simulation per process); None: one of ``ev.num_envs`` envs.
    """
    from robot_rl.cli.build import policy_view
    from robot_rl.evaluation import evaluate, record_video
    from robot_rl.logging import CURVE_PNG, plot_learning_curve, read_curve
    from sim.registry import ISAACLAB, make_env

    out_dir.mkdir(parents=True, exist_ok=True)
    act = policy.to(device).eval()  # any Policy, chunked or not: evaluation runs it through an ActionQueue

    result: dict[str, Any] = dict(extra)
    if env is not None:
        result["eval"] = evaluate(env, act, ev.num_episodes, ev.seed).to_json()
        has_success = getattr(getattr(env, "task", None), "has_success", True)
    else:
        # evaluation envs reset themselves whatever training's sim.autoreset was (evaluate counts episodes across resets)
        with make_env(task_name, dataclasses.replace(sim_cfg, num_envs=ev.num_envs, autoreset=True),
                      task_cfg) as eval_env:
            result["eval"] = evaluate(policy_view(eval_env, act), act, ev.num_episodes, ev.seed).to_json()
            has_success = getattr(getattr(eval_env, "task", None), "has_success", True)
    result["task_has_success"] = has_success  # False: success_rate is 0 by definition, not a result
    if ev.video and sim_cfg.backend == ISAACLAB:
        result["video"] = None
        print("eval: no video: the Isaac Lab adapter does not render (eval.video=false skips this message)",
              file=sys.stderr)
    elif ev.video:
        with make_env(task_name, dataclasses.replace(sim_cfg, num_envs=1, num_threads=1, autoreset=True),
                      task_cfg) as video_env:
            video = record_video(policy_view(video_env, act), act, out_dir / "policy.mp4", ev.seed,
                                 ev.video_episodes, ev.camera, ev.width, ev.height)
            result["video"] = None if video is None else str(video)  # None: not written (warned)
    points = read_curve(curve_dir)
    if points:
        png = plot_learning_curve(points, out_dir / CURVE_PNG, title=f"{task_name}")
        result["curve"] = None if png is None else str(png)
        for thr in (0.5, 0.9) if any("success_rate" in p for p in points) else ():  # runs in simulation
            hit = next((p for p in points if (p.get("success_rate") or 0.0) >= thr), None)
            result[f"time_to_success_{int(thr * 100)}"] = (
                None if hit is None else {"wall_s": hit["wall_s"], "env_steps": hit["env_steps"]})
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2))
    e = result["eval"]
    success = (f"success rate {e['success_rate']:.3f}" if has_success else
               f"no success event in {task_name} (mean length {e['mean_length']:.0f} steps)")
    print(f"eval: {success}, mean return {e['mean_return']:.3f} over {e['num_episodes']} episodes; results in "
          f"{out_dir}", file=sys.stderr)
    return result


def train(cfg: Any) -> Path:
    """``robot-rl train``: build (and resume), learn, then evaluate, film and plot into the run folder."""
    from robot_rl.cli.build import build_training
    from sim.registry import ISAACLAB

    run = build_training(cfg)
    runner, eval_s = run.runner, run.eval_settings
    with run.env:  # closed after the evaluation, which runs on it for Isaac Lab (one simulation per process)
        try:
            runner.learn()
        finally:
            run.logger.close()
        if run.group is not None:  # data-parallel: the ranks are done together; rank 0 reports alone. (A rank that
            run.group.close()  # failed skips this: its exit makes torchrun stop the others, none waits for it.)
        if not run.main:
            return run.run_dir
        print(f"trained {runner.env_steps} env steps in {runner.elapsed_s:.1f} s; run folder {run.run_dir}",
              file=sys.stderr)
        if eval_s.enabled:
            extra = {"checkpoint": str(runner.checkpoints.latest()), "env_steps": runner.env_steps,
                     "train_wall_s": runner.elapsed_s}
            _report(run.run_dir, run.algo.policy, run.task_name, run.task_cfg, run.sim_cfg, eval_s, run.device,
                    run.run_dir, extra, run.env if run.sim_cfg.backend == ISAACLAB else None)
    return run.run_dir


def evaluate_checkpoint(cfg: Any) -> dict[str, Any]:
    """``robot-rl eval``: load the exported policy of a checkpoint (no algorithm code) and report on it."""
    import torch
    from omegaconf import OmegaConf

    from policies import load_policy
    from policies.execution import (
        set_executed_steps,
        set_mean_of_samples,
        set_median_actions,
        set_sample_reduction,
        set_temporal_ensemble,
    )
    from robot_rl.checkpoint import POLICY_DIR, load_meta
    from robot_rl.cli.config import EvalCommand, resolve_device, typed
    from sim.randomization import RandomizationConfig
    from sim.registry import config_from_dict, sim_config_from_dict

    e = typed(EvalCommand, OmegaConf.to_container(cfg, resolve=True), "")
    device = resolve_device(e.device)
    torch.set_num_threads(1)
    folder, meta = load_meta(e.checkpoint)
    policy = load_policy(folder / POLICY_DIR, device)
    if e.executed_steps is not None:
        set_executed_steps(policy, e.executed_steps)
    if e.temporal_ensemble is not None:
        set_temporal_ensemble(policy, e.temporal_ensemble)
    if e.mean_of_samples is not None:
        set_mean_of_samples(policy, e.mean_of_samples)
    if e.sample_reduction is not None:
        set_sample_reduction(policy, e.sample_reduction)
    if e.median_actions is not None:
        set_median_actions(policy, e.median_actions)
    if "task" in meta:  # trained in simulation: evaluated on its own task
        if e.task is not None:
            raise ValueError(f"{folder} was trained on task {meta['task']!r}: task= is for policies trained offline")
        task, task_cfg = meta["task"], config_from_dict(meta["task"], meta["task_config"])
        sim_raw = dict(meta["config"]["sim"])
    elif e.task is None:  # an offline run's checkpoint names its dataset, not a task
        raise ValueError(f"{folder} was trained offline (on {meta.get('dataset_root', 'a dataset')}): name the task "
                         "to evaluate it on, e.g. task=so101_pick")
    else:
        task_raw = dict(e.task)
        task = task_raw.pop("name")
        task_cfg, sim_raw = config_from_dict(task, task_raw), {}
    sim_raw.update(num_envs=e.num_envs, num_threads=e.num_threads, device="cpu")
    nominal = dataclasses.asdict(RandomizationConfig())
    changed = {k: v for k, v in dataclasses.asdict(e.randomization).items() if v != nominal[k]}
    if changed:
        sim_raw["randomization"] = {**sim_raw.get("randomization", {}), **changed}
    sim_cfg = sim_config_from_dict(sim_raw)
    run_dir = folder.parent.parent
    # a policy trained offline may be evaluated on several tasks: each gets its own folder; another evaluation of the
    # same checkpoint and task (other settings, other seeds) gets the next free one, never overwriting a report
    out_dir = Path(e.out_dir) if e.out_dir else _free_folder(run_dir / (f"eval_{folder.name}" +
                                                                        (f"_{task}" if e.task else "")))
    ev = dataclasses.replace(e, checkpoint=str(folder))
    extra = {"checkpoint": str(folder), "task": task, "randomization": changed or None,
             "env_steps": meta.get("env_steps"), "iteration": meta.get("iteration"),
             "executed_steps": e.executed_steps, "temporal_ensemble": e.temporal_ensemble,
             "mean_of_samples": e.mean_of_samples, "sample_reduction": e.sample_reduction,
             "median_actions": e.median_actions}
    return _report(out_dir, policy, task, task_cfg, sim_cfg, ev, device, run_dir, extra)


def _free_folder(base: Path) -> Path:
    """``base``, or ``base_2``, ``base_3``, ...: the first that holds no evaluation report yet."""
    out, k = base, 2
    while (out / "eval.json").exists():
        out, k = base.with_name(f"{base.name}_{k}"), k + 1
    return out


def offline(cfg: Any) -> Path:
    """``robot-rl offline``: train a policy on a LeRobotDataset v3 (robot_rl/cli/offline.py)."""
    from robot_rl.cli.offline import offline as run_offline

    return run_offline(cfg)


def collect(cfg: Any) -> Any:
    """``robot-rl collect``: record episodes into a LeRobotDataset v3 (robot_rl/cli/collect.py)."""
    from robot_rl.cli.collect import collect as run_collect

    return run_collect(cfg)


def recap(cfg: Any) -> Any:
    """``robot-rl recap``: the RECAP improvement loop in simulation (robot_rl/cli/recap.py)."""
    from robot_rl.cli.recap import recap as run_recap

    return run_recap(cfg)


def deploy(cfg: Any) -> Any:
    """``robot-rl deploy``: run an exported policy on a robot through LeRobot, safely (robot_rl/cli/deploy.py)."""
    from robot_rl.cli.deploy import deploy as run_deploy

    return run_deploy(cfg)


def record(cfg: Any) -> Any:
    """``robot-rl record``: teleoperated demonstrations into a LeRobotDataset v3 (robot_rl/cli/record.py)."""
    from robot_rl.cli.record import record as run_record

    return run_record(cfg)


def progress(cfg: Any) -> Any:
    """``robot-rl progress``: a progress model for dense rewards from a dataset (robot_rl/cli/progress.py)."""
    from robot_rl.cli.progress import progress as run_progress

    return run_progress(cfg)


def success(cfg: Any) -> Any:
    """``robot-rl success``: train a success classifier, or label a dataset's copy with one (robot_rl/cli/success.py)."""
    from robot_rl.cli.success import success as run_success

    return run_success(cfg)


def actor(cfg: Any) -> Any:
    """``robot-rl actor``: act for a remote learner (robot_rl/cli/actor.py)."""
    from robot_rl.cli.actor import actor as run_actor

    return run_actor(cfg)


COMMANDS = {"train": train, "actor": actor, "eval": evaluate_checkpoint, "collect": collect, "offline": offline, "recap": recap,
            "deploy": deploy, "record": record, "progress": progress, "success": success}


def _usable_choice(cmd: str) -> Any:
    """Which algo choices a command takes: robot-rl offline the offline ones, train the others (the config group
    holds both); other groups and commands: every choice."""
    from robot_rl.cli.offline import OFFLINE_ALGOS

    def usable(group: str, choice: str) -> bool:
        if group != "algo" or cmd not in ("train", "offline"):
            return True
        return (choice in OFFLINE_ALGOS) == (cmd == "offline")

    return usable


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``robot-rl`` console script. Returns the exit status: 2 for a bad config, checkpoint or
    policy file (every ``MalformedFileError``), 3 when training stopped on non-finite updates, 4 when a write failed
    (no space left, a read-only disk: ``OutputWriteError`` names the file and the checkpoint to resume from)."""
    from hydra.errors import HydraException

    from policies.safetensors_check import MalformedFileError
    from robot_rl.algos.guard import NonFiniteError
    from robot_rl.checkpoint import OutputWriteError
    from robot_rl.cli.build import CONFIG_DIR, compose
    from robot_rl.cli.config import explain_unknown_override

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in (*HELP_FLAGS, "help"):
        print(USAGE.format(config_dir=CONFIG_DIR))
        return 0
    cmd, overrides = argv[0], [a for a in argv[1:] if a not in HELP_FLAGS]
    wants_help = any(a in HELP_FLAGS for a in argv[1:])
    if cmd not in COMMANDS:
        print(f"robot-rl: unknown command {cmd!r}; allowed: {sorted(COMMANDS)}\n\n" + USAGE.format(
            config_dir=CONFIG_DIR), file=sys.stderr)
        return 2
    flags = [a for a in overrides if a.startswith("-")]
    if flags:  # settings are key=value; the only flag is --help (Hydra would report a grammar error at the dash)
        print(f"robot-rl {cmd}: error: unknown flag {flags[0]!r}: settings are key=value, and --help lists them",
              file=sys.stderr)
        return 2
    os.environ.setdefault("MUJOCO_GL", "egl")  # offscreen rendering for videos on machines without a display
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if wants_help:
            print(command_help(cmd, compose(cmd, overrides)))
            return 0
        COMMANDS[cmd](compose(cmd, overrides))
    except HydraException as err:
        explained = explain_unknown_override(str(err), overrides, lambda o: compose(cmd, o), _usable_choice(cmd))
        print(f"robot-rl {cmd}: error: {explained}",
              file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, MalformedFileError) as err:
        print(f"robot-rl {cmd}: error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:  # an optional backend not installed (Isaac Lab, MuJoCo Warp): our message says how
        if "pip install" not in str(err):
            raise  # anything else is a bug: its traceback is what helps
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
