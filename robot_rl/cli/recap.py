"""``robot-rl recap``: the RECAP improvement loop in simulation.

    robot-rl recap task=so101_lift rounds=2 [run_dir=DIR] [init_dataset=DIR] [episodes_per_round=50] [steps=2000]
    robot-rl recap ... init_dataset=DIR init_run=RUN    (round 0 = an existing robot-rl offline algo=recap run on DIR)
    robot-rl recap ... "offline=['algo.value.steps=500','algo.recap.positive_share=0.5']"   (Hydra: quote each item)
    robot-rl recap ... warm_start=true guidance_beta=2.5   (fine-tune round to round; sample at CFG β 2.5)

Round 0 starts from data: a copy of ``init_dataset`` (the source is only read), or ``initial_episodes`` of the
scripted expert at ``initial_quality``; it trains with ``robot-rl offline algo=recap`` (value model, labels, the
conditioned flow VLA) and evaluates. ``init_run`` names a finished ``robot-rl offline algo=recap`` run on
``init_dataset`` to take as round 0's training instead (copied; checked to be a RECAP run on that dataset). Each
further round:

1. **collect** ``episodes_per_round`` with the current policy; the previous round's value model watches every
   frame, and where it stays below ``intervene_below`` for ``intervene_patience`` steps (after the first
   ``intervene_after`` steps of the episode) the scripted expert, playing the human, takes over for the rest of that
   episode (recorded with ``actor=human``, so ``intervention=True``: RECAP labels those frames positive);
2. **append** them to the run's dataset (``<run>/data``);
3. **retrain** the value model, **relabel**, **retrain** the policy (``robot-rl offline algo=recap`` on all the
   data, ``steps`` gradient steps, from scratch or, with ``warm_start=true``, from the previous round's policy;
   ``offline=[...]`` adds overrides such as ``algo.value.steps=500``);
4. **evaluate** the exported policy: ``eval_episodes`` seeded episodes, no interventions.

Per round: success rate, failure rate (episodes ending without success) and throughput (successes per hour of robot
time: success rate / mean episode duration), and the collection's intervention rate, in ``<run>/results.json``, a
Markdown table (``table.md``) and ``recap.png``. ``<run>/state.json`` lists the finished stages: run the same command
again (same ``run_dir``) after a crash and it resumes at the first unfinished one (a collection keeps its committed
episodes, a training run resumes from its last checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from policies import keys
from robot_rl.models.state_lags import StateLags

STATE_FILE = "state.json"
INTERVENE_TRIGGERS = ("threshold", "stall")


@dataclass
class RecapCommand:
    """configs/recap.yaml: ``robot-rl recap`` (``task`` and ``sim`` are the groups chosen by name)."""

    rounds: int = 2  # improvement rounds after round 0 (each: collect, append, retrain, evaluate)
    run_dir: str | None = None  # default: runs/recap_<task>_<YYYYmmdd_HHMMSS>; an existing one is resumed
    init_dataset: str | None = None  # round 0's data, copied (None: the scripted expert records it)
    init_run: str | None = None  # a robot-rl offline algo=recap run on init_dataset: round 0's training, copied
    initial_episodes: int = 100  # scripted-expert episodes of round 0 when init_dataset is None
    initial_quality: float = 0.5  # their quality (sim.experts: flaws with probability 1 - quality)
    episodes_per_round: int = 50  # episodes collected by the policy (+ interventions) per round
    steps: int = 2000  # policy gradient steps per round
    offline: list[str] = field(default_factory=list)  # extra overrides of each round's robot-rl offline algo=recap
    # Each round's policy training starts from the previous round's policy (fine-tuning: init_policy) instead of
    # from scratch; the value model is always refitted.
    warm_start: bool = False
    # CFG β the loop's policies sample with, in collection and evaluation (None: each exported policy's own)
    guidance_beta: float | None = None
    interventions: bool = True  # the scripted expert takes over where the value model says the episode goes wrong
    intervene_below: float = -0.8  # value threshold (value units: -1 is a predicted failure)
    intervene_after: int = 10  # control steps into an episode before the value may trigger a take-over
    intervene_patience: int = 3  # consecutive steps below the threshold that trigger it
    # what asks for the expert: "threshold" (V below intervene_below for intervene_patience steps) or "stall" (the
    # value's Theil-Sen slope over the last intervene_window steps below intervene_min_progress / M per step, M
    # the task's episode length, the value's scale: sustained decline or stagnation; robot_rl.hil.ValueStall)
    intervene_trigger: str = "threshold"
    intervene_window: int = 20  # steps of value history for the stall trigger
    intervene_min_progress: float = 0.25  # fraction of an on-course episode's value gain per step (1 / M)
    intervene_ceiling: float | None = -0.1  # the stall trigger asks only where V is below this (value units)
    # Recovery before the expert (DESIGN.md §5; robot_rl.hil.recovery): the trigger's first ``recoveries`` requests of
    # an episode drive the arm, in joint space, to the best-valued of the ``recovery_k`` dataset intervention frames
    # nearest to the current one (in the value model's features; every ``recovery_every``-th frame in the memory),
    # then hand back to the policy; only a request after that calls the expert.
    recovery: bool = False
    recoveries: int = 1
    recovery_k: int = 8
    recovery_every: int = 5
    recovery_max_step: float = 3.0  # degrees per control step, the largest joint move
    recovery_tolerance: float = 3.0  # degrees: arrived when every joint is this close
    recovery_max_steps: int = 40  # control steps a recovery may take
    eval_episodes: int = 50  # seeded evaluation episodes per round
    eval_envs: int = 25  # envs stepped together in evaluation
    eval_seed: int = 50_000  # evaluation's env seed (collection uses seed + 1000 * round)
    seed: int = 0
    device: str = "cpu"  # cpu | cuda | cuda:<i> | auto
    torch_threads: int = 2
    task: Any = None
    sim: Any = None

    def __post_init__(self) -> None:
        if self.rounds < 0 or self.initial_episodes < 1 or self.episodes_per_round < 1 or self.steps < 1:
            raise ValueError("rounds must be >= 0; initial_episodes, episodes_per_round and steps >= 1")
        if not 0.0 <= self.initial_quality <= 1.0:
            raise ValueError(f"initial_quality must lie in [0, 1], got {self.initial_quality}")
        if self.eval_episodes < 1 or self.eval_envs < 1 or self.intervene_patience < 1 or self.intervene_after < 0:
            raise ValueError("eval_episodes, eval_envs and intervene_patience must be >= 1, intervene_after >= 0")
        if self.intervene_trigger not in INTERVENE_TRIGGERS:
            raise ValueError(f"intervene_trigger={self.intervene_trigger!r}; allowed: {list(INTERVENE_TRIGGERS)}")
        if self.intervene_window < 2:
            raise ValueError(f"intervene_window must be >= 2 steps, got {self.intervene_window}")
        if self.guidance_beta is not None and self.guidance_beta < 1.0:
            raise ValueError(f"guidance_beta must be >= 1 (RECAP samples toward the positive indicator), got "
                             f"{self.guidance_beta}")
        if self.recovery and (self.recoveries < 1 or self.recovery_k < 1 or self.recovery_every < 1
                              or self.recovery_max_steps < 1 or not self.recovery_max_step > 0
                              or not self.recovery_tolerance > 0):
            raise ValueError("recoveries, recovery_k, recovery_every and recovery_max_steps must be >= 1, "
                             "recovery_max_step and recovery_tolerance > 0")
        if self.init_run is not None and self.init_dataset is None:
            raise ValueError("init_run needs init_dataset: the dataset that run was trained on")


# ------------------------------------------------------------------------------------------- the actor
class InterveningActor:
    """The policy acts (through an ``ActionQueue`` on the frames); a value model watches through the command's
    trigger (``robot_rl.hil.triggers``: V(o) below ``intervene_below`` for ``intervene_patience`` steps, or a stalled
    value); from the step it fires, after ``intervene_after`` steps, the expert (``collect.ExpertActor``) takes that
    env over until its episode ends (``robot_rl.hil.InterventionAgent``, latched, the person not watching). Returns
    per-env targets, the policy's proposals and who acted (int64 [N]).

    Args:
        value_scale: M, the value's steps per unit (the labels' max episode length): a stall is progress slower than
            ``intervene_min_progress`` / M per step.
    """

    def __init__(self, view: Any, policy: Any, expert_actor: Any, value_model: Any, cmd: RecapCommand,
                 value_scale: int, memory: Any = None) -> None:
        from policies import ActionQueue
        from robot_rl.hil import InterventionAgent, JointRecovery

        self.view, self.value_model, self.cmd = view, value_model, cmd
        self.queue = ActionQueue(policy, view.num_envs, view.action_dim)
        n = view.num_envs
        recovery = None if memory is None else JointRecovery(n, view.action_dim, cmd.recovery_max_step,
                                                             cmd.recovery_tolerance, cmd.recovery_max_steps)
        self.agent = InterventionAgent(_ExpertPerson(expert_actor), intervention_trigger(cmd, n, value_scale), n,
                                       watch=False, latch=True, recovery=recovery, memory=memory,
                                       recoveries=cmd.recoveries)
        lags = list(value_model.cfg.state_lags)  # the joints' earlier readings, where the value model reads them
        self.lags = StateLags(lags, n) if lags else None

    def __call__(self, frames: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        proposal = self.queue(frames).cpu()
        if not self.cmd.interventions:
            return proposal, proposal, self.agent.arbiter.actor
        if self.lags is not None:
            frames = {**frames, keys.OBS_STATE_LAGS: self.lags(frames[keys.OBS_STATE])}
        features = None
        if self.agent.recovery is None:
            value = self.value_model.value(frames)
        else:  # the same value, and the memory's key beside it
            value, features = self.value_model.value_and_features(frames)
            features = features.cpu()
        target, actor = self.agent(frames, proposal, signal=value.cpu(), features=features)
        if bool(self.agent.handed_back.any()):  # the policy starts a fresh chunk where a recovery handed back
            self.queue.reset(self.agent.handed_back.nonzero().flatten())
        return target, proposal, actor

    def reset(self, env_ids: torch.Tensor | None) -> None:
        self.queue.reset(env_ids)
        if env_ids is None:
            self.agent.restart()
        else:
            self.agent.end(torch.zeros(self.view.num_envs, dtype=torch.bool).index_fill_(0, env_ids.cpu(), True))
        if self.lags is not None:
            self.lags.reset(env_ids)


class _ExpertPerson:
    """``collect.ExpertActor`` (targets in the view's degrees) as the person of an ``InterventionAgent``."""

    def __init__(self, expert_actor: Any) -> None:
        self.expert = expert_actor

    def act(self, frames: dict[str, Any]) -> torch.Tensor:
        return self.expert(frames)[0].cpu()

    def reset(self, env_ids: torch.Tensor | None) -> None:
        self.expert.reset(env_ids)


@torch.no_grad()
def recovery_memory(value_model: Any, data: Path, cmd: RecapCommand) -> Any:
    """The memory of good states of ``data``: every ``cmd.recovery_every``-th frame where a person acted (``actor``
    human; ``intervention`` where the dataset has no actor column), keyed by ``value_model``'s features, valued by it,
    its joints the goal. A recovery's own frames are not remembered."""
    from robot_rl.algos.value_learning import value_frames
    from robot_rl.data.lerobot_format import read_meta
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler
    from robot_rl.hil import StateMemory

    who = keys.ACTOR_COL if keys.ACTOR_COL in read_meta(data).features else keys.INTERVENTION_COL
    sampler = ChunkSampler(ChunkDatasetConfig(root=str(data), horizon=1, cameras=list(value_model.cfg.cameras),
                                              augment=False, batch_size=1, extra_columns=[who], progress=False))
    col = sampler.columns()[who].reshape(-1)
    took = col == keys.ACTOR_HUMAN if who == keys.ACTOR_COL else col.to(torch.bool)
    rows = took.nonzero().flatten()[::cmd.recovery_every]
    if len(rows) == 0:
        raise ValueError(f"recovery=true: {data} has no intervention frames to remember")
    value_model.eval()
    feats, goals, values = [], [], []
    for part in rows.split(256):
        frame = value_frames(value_model, sampler, part)
        v, f = value_model.value_and_features(frame)
        feats.append(f.cpu())
        values.append(v.cpu())
        goals.append(frame[keys.OBS_STATE].float().cpu())
    memory = StateMemory(torch.cat(feats), torch.cat(goals), torch.cat(values), cmd.recovery_k)
    print(f"recovery memory: {len(memory)} states (1 in {cmd.recovery_every} of the {int(took.sum())} frames a person "
          f"drove in {data})", file=sys.stderr)
    return memory


def intervention_trigger(cmd: RecapCommand, num_envs: int, value_scale: int) -> Any:
    """The command's take-over trigger over ``num_envs`` envs (``intervene_trigger``)."""
    from robot_rl.hil import ValueStall, ValueThreshold

    if cmd.intervene_trigger == "stall":
        return ValueStall(cmd.intervene_window, cmd.intervene_min_progress / value_scale, cmd.intervene_after,
                          num_envs, ceiling=cmd.intervene_ceiling)
    return ValueThreshold(cmd.intervene_below, cmd.intervene_patience, cmd.intervene_after, num_envs)


# ------------------------------------------------------------------------------------------- stages
def _task_and_sim(cmd_raw: dict[str, Any]) -> tuple[str, Any, Any]:
    from sim.registry import config_from_dict, sim_config_from_dict

    task_raw = dict(cmd_raw["task"])
    name = task_raw.pop("name")
    return name, config_from_dict(name, task_raw), sim_config_from_dict(cmd_raw["sim"])


def collect_round(cmd: RecapCommand, task: str, task_cfg: Any, sim_cfg: Any, data: Path, episodes: int, seed: int,
                  policy: Any = None, value_model: Any = None, quality: float = 1.0,
                  memory_data: Path | None = None) -> dict[str, Any]:
    """Append ``episodes`` episodes to the dataset ``data``: the scripted expert at ``quality`` (no policy), or the
    policy with the expert intervening (after a recovery with ``cmd.recovery``, to a state remembered from
    ``memory_data``'s interventions, default ``data``). Returns counts and seconds."""
    from robot_rl.cli.collect import ExpertActor, record
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig
    from sim.experts import make_expert
    from sim.lerobot_view import LeRobotView
    from sim.registry import make_env
    from sim.so101 import LEROBOT_STATE_NAMES

    cameras, size = tuple(task_cfg.cameras), (int(task_cfg.image_height), int(task_cfg.image_width))
    start = time.perf_counter()
    memory = (recovery_memory(value_model, memory_data or data, cmd)
              if policy is not None and cmd.interventions and cmd.recovery else None)
    with make_env(task, sim_cfg, dataclasses.replace(task_cfg, cameras=[])) as env:
        view = LeRobotView(env, cameras=cameras, image_size=size)
        spec = DatasetSpec(round(1.0 / env.control_dt), tuple(LEROBOT_STATE_NAMES), {c: size for c in cameras})
        expert = ExpertActor(view, make_expert(env, quality=1.0 if policy is not None else quality, seed=seed))
        actor = expert if policy is None else InterveningActor(view, policy, expert, value_model, cmd,
                                                                   int(task_cfg.episode_length), memory)
        recorder = EpisodeRecorder(RecorderConfig(root=str(data), append=data.exists()), spec, env.num_envs,
                                   env.max_episode_length)
        try:
            out = record(view, actor, recorder, episodes, seed)
        finally:
            recorder.close()
        dt = env.control_dt
    out.update(seconds=round(time.perf_counter() - start, 1), robot_hours=out["frames"] * dt / 3600.0)
    return out


def train_round(cmd: RecapCommand, data: Path, run: Path, max_len: int, init: Path | None = None) -> Path:
    """``robot-rl offline algo=recap`` on the data (resumed from its last checkpoint when one exists), its policy
    starting from the weights of the run ``init`` when given; returns the run folder."""
    from robot_rl.checkpoint import CHECKPOINTS_DIR
    from robot_rl.cli.build import compose
    from robot_rl.cli.offline import offline

    overrides = ["algo=recap", f"dataset.root={data}", f"run_dir={run}", f"steps={cmd.steps}", f"seed={cmd.seed}",
                 f"device={cmd.device}", f"torch_threads={cmd.torch_threads}",
                 f"algo.labels.max_episode_length={max_len}", *cmd.offline,
                 *([f"init_policy={_exported(init)}"] if init is not None else [])]
    ckpts = run / CHECKPOINTS_DIR
    if ckpts.is_dir() and any(p.name.startswith("iter_") for p in ckpts.iterdir()):
        overrides.append(f"resume={run}")
    offline(compose("offline", overrides))
    return run


def check_init_run(init_run: Path, init_dataset: Path) -> None:
    """Refuse, naming what is wrong, an ``init_run`` that is not a finished ``robot-rl offline algo=recap`` run on
    ``init_dataset`` with its value model, labels and an exported policy."""
    from robot_rl.algos.advantages import VALUE_DIR
    from robot_rl.checkpoint import load_meta

    try:
        _, meta = load_meta(init_run)
    except (FileNotFoundError, ValueError) as err:
        raise ValueError(f"bad config: init_run={init_run} is not a finished robot-rl offline run ({err})") from err
    if meta.get("algo") != "recap":
        raise ValueError(f"bad config: init_run={init_run} is a robot-rl offline algo={meta.get('algo')} run; the "
                         "loop needs algo=recap (its value model watches the next round's collection)")
    if Path(meta.get("dataset_root", "")).resolve() != init_dataset.resolve():
        raise ValueError(f"bad config: init_run={init_run} was trained on {meta.get('dataset_root')}, not "
                         f"init_dataset={init_dataset}")
    for need in (init_run / VALUE_DIR, init_run / "labels" / "labels.json", _exported(init_run)):
        if not need.exists():
            raise ValueError(f"bad config: init_run={init_run} lacks {need}")


def evaluate_round(cmd: RecapCommand, task: str, task_cfg: Any, sim_cfg: Any, policy: Any) -> dict[str, Any]:
    """Success rate, failure rate and throughput (successes per hour of robot time) over seeded episodes."""
    from robot_rl.cli.build import policy_view
    from robot_rl.evaluation import evaluate
    from sim.registry import make_env

    start = time.perf_counter()
    sim = dataclasses.replace(sim_cfg, num_envs=min(cmd.eval_envs, cmd.eval_episodes))
    with make_env(task, sim, dataclasses.replace(task_cfg, cameras=[])) as env:
        r = evaluate(policy_view(env, policy), policy.eval(), cmd.eval_episodes, cmd.eval_seed)
        dt = env.control_dt
    return {**r.to_json(), "failure_rate": 1.0 - r.success_rate,
            "throughput_per_hour": throughput(r.success_rate, r.mean_length, dt),
            "seconds": round(time.perf_counter() - start, 1)}


def throughput(success_rate: float, mean_length: float, control_dt: float) -> float:
    """Successes per hour of robot time: success rate / (mean episode length · control period) · 3600."""
    return 3600.0 * success_rate / max(mean_length * control_dt, 1e-9)


# ------------------------------------------------------------------------------------------- the loop
class _State:
    """``<run>/state.json``: finished stages and what they produced, rewritten atomically after each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"done": {}, "started": {}}

    def done(self, stage: str) -> Any:
        return self.data["done"].get(stage)

    def finish(self, stage: str, result: Any) -> None:
        self.data["done"][stage] = result
        self._write()

    def start(self, stage: str, value: Any) -> Any:
        """The value stored when ``stage`` first started (kept across resumes)."""
        self.data["started"].setdefault(stage, value)
        self._write()
        return self.data["started"][stage]

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(self.data, indent=2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


# What a resumed loop may change: how many rounds (to extend it) and how this machine runs it
RESUME_FREE = ("rounds", "run_dir", "device", "torch_threads", "progress")


def check_resume_settings(run: Path, raw: dict[str, Any], state: _State) -> None:
    """A run folder holding finished stages resumes only with the settings that made them (``RESUME_FREE`` aside):
    anything else would mix rounds made one way with rounds made another, and its config.yaml would lie.

    Raises:
        ValueError: naming each setting that differs, its value then and now.
    """
    from omegaconf import OmegaConf

    from robot_rl.cli.config import changed_settings

    path = run / "config.yaml"
    if not state.data["done"] or not path.is_file():
        return
    then = OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # as written: interpolations unresolved
    # a setting added since the run was made counts as its default then (the run behaved so)
    then = {**{f.name: f.default for f in dataclasses.fields(RecapCommand)
               if f.name not in then and f.default is not dataclasses.MISSING}, **then}
    changed = changed_settings(then, raw, RESUME_FREE)
    if changed:
        shown = "; ".join(f"{k}: {was!r} then, {now!r} now" for k, (was, now) in list(changed.items())[:8])
        raise ValueError(f"run_dir={run} holds a recap run made with other settings ({shown}"
                         f"{'; ...' if len(changed) > 8 else ''}): resume it with the same ones (only "
                         f"{', '.join(RESUME_FREE)} may change), or give a new run_dir")


def _roll_back_a_torn_episode(data: Path) -> None:
    """The loop's dataset as its last committed episode left it: a collection killed while writing an episode leaves
    its files half-written and info.json maybe truncated or counting it (``repair_dataset``; a no-op when whole)."""
    from robot_rl.data.recorder import read_commit, repair_dataset

    if data.is_dir() and read_commit(data) is not None:
        for path in repair_dataset(data):
            print(f"recap: rolled back {path} (a collection stopped mid-episode)", file=sys.stderr)


def _num_episodes(data: Path) -> int:
    from robot_rl.data.lerobot_loader import read_meta

    return int(read_meta(data).info["total_episodes"]) if (data / "meta" / "info.json").is_file() else 0


def _collected_stats(data: Path, first: int) -> dict[str, Any]:
    """Of the episodes ``first``.. of the dataset: how many, their success and intervention rates (episodes with
    at least one intervention frame) and the share of intervention frames."""
    import numpy as np

    from robot_rl.data.lerobot_format import read_frames, read_meta

    meta = read_meta(data)
    eps = meta.episodes["episode_index"].astype(np.int64)
    eps = eps[eps >= first]
    if not len(eps):
        return {"episodes": 0}
    cols = read_frames(meta, eps, [keys.SUCCESS_COL, keys.INTERVENTION_COL]).columns
    e = cols["episode_index"].reshape(-1)
    succ, inter = (cols[c].reshape(-1).astype(bool) for c in (keys.SUCCESS_COL, keys.INTERVENTION_COL))
    per_ep = [(bool(succ[e == i].any()), bool(inter[e == i].any())) for i in eps]
    successes, takeovers = sum(s for s, _ in per_ep), sum(x for _, x in per_ep)
    return {"episodes": len(eps), "success_rate": successes / len(eps), "intervention_rate": takeovers / len(eps),
            "intervention_frames": float(inter.mean()), "frames": len(e),
            "takeovers_per_success": takeovers / successes if successes else None}


def _exported(run: Path) -> Path:
    from robot_rl.checkpoint import POLICY_DIR, load_meta

    folder, _ = load_meta(run)
    return folder / POLICY_DIR


def _with_beta(policy: Any, beta: float | None) -> Any:
    """``policy`` sampling with CFG β = ``beta`` (a conditioned flow VLA; unchanged when ``beta`` is None)."""
    if beta is not None and getattr(policy.cfg, "conditioning", False):
        policy.cfg.guidance_beta = float(beta)
    return policy


def recap(cfg: Any) -> dict[str, Any]:
    """``robot-rl recap``: run (or resume) the loop; returns the per-round results."""
    from omegaconf import OmegaConf

    from policies import load_policy
    from robot_rl.algos.advantages import VALUE_DIR
    from robot_rl.algos.value_learning import load_value_model
    from robot_rl.cli.build import seed_everything
    from robot_rl.cli.config import resolve_device, typed

    raw = OmegaConf.to_container(cfg, resolve=True)
    cmd = typed(RecapCommand, {k: v for k, v in raw.items() if k not in ("task", "sim")}, "")
    task, task_cfg, sim_cfg = _task_and_sim(raw)
    device = resolve_device(cmd.device)
    torch.set_num_threads(cmd.torch_threads)
    seed_everything(cmd.seed)
    run = Path(cmd.run_dir or f"runs/recap_{task}_{time.strftime('%Y%m%d_%H%M%S')}")
    run.mkdir(parents=True, exist_ok=True)
    state, data = _State(run / STATE_FILE), run / "data"
    check_resume_settings(run, raw, state)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    if cmd.init_run and state.done("round_0/train") is None:  # once adopted, a resume no longer needs the source
        check_init_run(Path(cmd.init_run), Path(cmd.init_dataset))
    max_len = int(task_cfg.episode_length)
    rows = []
    for r in range(cmd.rounds + 1):
        rdir = run / f"round_{r:03d}"
        stage = f"round_{r}/collect"
        if state.done(stage) is None:
            seed = cmd.seed + 1000 * r
            if r == 0 and cmd.init_dataset:
                shutil.rmtree(data, ignore_errors=True)
                shutil.copytree(cmd.init_dataset, data)  # the source is only read
                result = {"episodes": _num_episodes(data), "copied_from": str(cmd.init_dataset)}
            else:
                _roll_back_a_torn_episode(data)  # a crash inside this stage: back to its last whole episode
                first = state.start(stage, _num_episodes(data))
                want = cmd.initial_episodes if r == 0 else cmd.episodes_per_round
                left = want - (_num_episodes(data) - first)
                policy = value = None
                if r > 0:
                    prev = run / f"round_{r - 1:03d}" / "train"
                    policy = _with_beta(load_policy(_exported(prev), device).eval(), cmd.guidance_beta)
                    value, _ = load_value_model(prev / VALUE_DIR, device)
                timing = collect_round(cmd, task, task_cfg, sim_cfg, data, left, seed, policy, value,
                                       cmd.initial_quality) if left > 0 else {}
                result = {**_collected_stats(data, first), "seconds": timing.get("seconds"),
                          "robot_hours": timing.get("robot_hours")}
            state.finish(stage, result)
            print(f"recap round {r}: collected {json.dumps(result)}", file=sys.stderr)
        stage = f"round_{r}/train"
        if state.done(stage) is None:
            start = time.perf_counter()
            if r == 0 and cmd.init_run:
                shutil.rmtree(rdir / "train", ignore_errors=True)
                shutil.copytree(cmd.init_run, rdir / "train")  # the source run is only read
                result = {"seconds": 0.0, "adopted": str(cmd.init_run)}
            else:
                init = run / f"round_{r - 1:03d}" / "train" if cmd.warm_start and r > 0 else None
                train_round(cmd, data, rdir / "train", max_len, init)
                result = {"seconds": round(time.perf_counter() - start, 1)}
            state.finish(stage, result)
        stage = f"round_{r}/eval"
        if state.done(stage) is None:
            policy = _with_beta(load_policy(_exported(rdir / "train"), device), cmd.guidance_beta)
            state.finish(stage, evaluate_round(cmd, task, task_cfg, sim_cfg, policy))
        rows.append(_row(r, state, rdir))
        print(f"recap round {r}: success {rows[-1]['success_rate']:.3f}, throughput "
              f"{rows[-1]['throughput_per_hour']:.0f}/h", file=sys.stderr)
    results = {"task": task, "rounds": rows}
    (run / "results.json").write_text(json.dumps(results, indent=2))
    (run / "table.md").write_text(table(rows))
    plot_rounds(rows, run / "recap.png", task)
    print(table(rows), file=sys.stderr)
    return results


def _row(r: int, state: _State, rdir: Path) -> dict[str, Any]:
    ev, col = state.done(f"round_{r}/eval"), state.done(f"round_{r}/collect")
    labels = json.loads((rdir / "train" / "labels" / "labels.json").read_text())
    return {"round": r, "success_rate": ev["success_rate"], "failure_rate": ev["failure_rate"],
            "throughput_per_hour": ev["throughput_per_hour"], "mean_length": ev["mean_length"],
            "collected_episodes": col.get("episodes", 0), "collected_success_rate": col.get("success_rate"),
            "intervention_rate": col.get("intervention_rate") if r > 0 else None,
            "takeovers_per_success": col.get("takeovers_per_success") if r > 0 else None,
            "dataset_frames": labels["frames"], "voc_train": labels.get("summary", {}).get("voc"),
            "train_s": state.done(f"round_{r}/train")["seconds"], "collect_s": col.get("seconds"),
            "eval_s": ev["seconds"]}


def table(rows: list[dict[str, Any]]) -> str:
    """The per-round Markdown table."""
    lines = [("| round | success | failure | throughput (/h) | episodes with a take-over | take-overs per success "
              "| frames | VOC (train) |"), "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        inter = "-" if row["intervention_rate"] is None else f"{row['intervention_rate']:.2f}"
        per = row.get("takeovers_per_success")  # absent from rows of runs made before it was counted
        per = "-" if per is None else f"{per:.2f}"
        voc = "-" if row["voc_train"] is None else f"{row['voc_train']:.3f}"
        lines.append(f"| {row['round']} | {row['success_rate']:.3f} | {row['failure_rate']:.3f} | "
                     f"{row['throughput_per_hour']:.0f} | {inter} | {per} | {row['dataset_frames']} | {voc} |")
    return "\n".join(lines) + "\n"


def plot_rounds(rows: list[dict[str, Any]], path: Path, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [row["round"] for row in rows]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax.plot(rounds, [row["success_rate"] for row in rows], "o-", label="success")
    ax.plot(rounds, [row["failure_rate"] for row in rows], "s--", label="failure")
    ax.set_xlabel("round")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.grid(alpha=0.3)
    bx.plot(rounds, [row["throughput_per_hour"] for row in rows], "o-")
    bx.set_xlabel("round")
    bx.set_ylabel("successes per hour of robot time")
    bx.grid(alpha=0.3)
    fig.suptitle(f"RECAP improvement loop, {task}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
