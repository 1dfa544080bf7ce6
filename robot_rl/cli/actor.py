"""``robot-rl actor``: one actor of a remote learner (``robot-rl train remote.listen=...``), robot_rl/remote."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from robot_rl.cli.config import HilSettings, RewardSettings
from robot_rl.remote.settings import RemoteSettings


@dataclass
class ActorCommand:
    """configs/actor.yaml: ``robot-rl actor`` (``task`` and ``sim`` are the groups chosen by name; they must be the
    learner's task and ``sim.num_envs``)."""

    seed: int = 0  # env.reset seed (give each actor its own)
    torch_threads: int = 1  # torch intra-op threads for the policy's forward pass
    max_steps: int | None = None  # vector steps at most (None: until the learner stops)
    remote: RemoteSettings = field(default_factory=RemoteSettings)
    # a person watching this actor's envs (hil.person=expert: the task's scripted expert plays them), as robot-rl
    # train's hil.*: the transitions they drive go to the learner tagged, its offline half (HIL-SERL)
    hil: HilSettings = field(default_factory=HilSettings)
    # dense rewards from a progress model (reward.progress=<robot-rl progress folder>), as robot-rl train's reward.*:
    # the shaping runs here, where the envs are, at the learner's discount
    reward: RewardSettings = field(default_factory=RewardSettings)
    task: Any = None
    sim: Any = None


def actor(cfg: Any) -> dict[str, Any]:
    """Build the env, act for the learner until it stops, print what happened as JSON (stdout)."""
    import torch
    from omegaconf import OmegaConf

    from robot_rl.cli.build import build_env, build_hil, build_shaping, seed_everything
    from robot_rl.cli.config import typed
    from robot_rl.remote.actor import run_actor

    raw = OmegaConf.to_container(cfg, resolve=True)
    task_raw, sim_raw = raw.pop("task"), raw.pop("sim")
    remote = typed(RemoteSettings, raw.pop("remote"), "remote")
    hil_s = typed(HilSettings, raw.pop("hil"), "hil")
    reward_s = typed(RewardSettings, raw.pop("reward"), "reward")
    s = typed(ActorCommand, raw, "")
    seed_everything(s.seed)
    torch.set_num_threads(s.torch_threads)
    env = build_env(task_raw, sim_raw)
    with env:
        hil = build_hil(hil_s, None, env, s.seed)
        shape = None if reward_s.progress is None else (
            lambda e, gamma: build_shaping(reward_s, e, gamma, learner="the learner (it sent no discount)"))
        report = run_actor(env, remote, task_raw["name"], s.seed, s.max_steps, hil, shape)
    out = asdict(report)
    print(json.dumps(out))
    if report.holds:
        print(f"actor {remote.actor_id}: held {report.holds} time(s), {report.hold_s:.1f} s in all", file=sys.stderr)
    return out
