"""Isaac Lab tasks behind our batched torch ``VecEnv`` contract, so our PPO / FlashSAC runners train on them.

    env = make_isaaclab_env("Isaac-Cartpole", num_envs=4096, device="cuda:0")

Isaac Lab's ``ManagerBasedRLEnv`` and ``DirectRLEnv`` are already batched torch envs with same-step auto-reset
(Isaac Lab 3.0.0, ``isaaclab/envs/manager_based_rl_env.py`` and ``direct_rl_env.py``):

    obs_dict, extras = env.reset(seed=...)
    obs_dict, reward[N], terminated[N], time_outs[N], extras = env.step(action[N, A])

so this adapter only converts. ``obs_dict["policy"]`` -> our ``policy`` group, ``obs_dict["critic"]`` (Isaac Lab's
privileged group: ``DirectRLEnvCfg.state_space`` or a manager-based ``critic`` group) -> our ``critic`` group, or
a copy of ``policy`` when the task has none; other concatenated groups pass through under their own names.
``time_outs`` -> ``truncated`` (a time-out that is also a true termination counts as terminated); with
``cfg.is_finite_horizon`` Isaac Lab's wrappers send no time-out signal (``isaaclab_rl/rsl_rl/vecenv_wrapper.py``),
so time-outs are terminations here too. The true last observation comes from ``extras["final_obs"]``, which Isaac
Lab fills before its reset when ``cfg.compute_final_obs`` is set (``make_isaaclab_env`` sets it). Episode return,
length and success are tracked here; Isaac Lab's ``extras["log"]`` (per-term episode sums, termination rates) is
logged as ``isaaclab/<key>`` on steps where an episode ended, which is when Isaac Lab refills it.

The CLI builds one from ``sim=isaaclab task=isaaclab task.id=<gymnasium id>`` (``IsaacLabTaskConfig`` below,
``sim/registry.py``). Nothing here imports isaaclab at module import; ``make_isaaclab_env`` does, when called.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import torch

from policies import keys
from robot_rl.env import EpisodeTracker, Obs, ObsSpec, VecEnv, actor_ids, sanitize_action

log = logging.getLogger(__name__)

SuccessFn = Callable[[Any], torch.Tensor]  # unwrapped Isaac Lab env, after step -> bool [N]
LOG_PREFIX = "isaaclab/"


@dataclass
class IsaacLabTaskConfig:
    """``task=isaaclab`` (configs/task/isaaclab.yaml): which Isaac Lab task and how the adapter reads it, i.e.
    ``make_isaaclab_env``'s task arguments. The simulator side (N, device, seed) is ``sim=isaaclab``'s SimConfig."""

    id: str  # a gymnasium id registered by isaaclab_tasks, e.g. "Isaac-Cartpole" (required)
    action_scale: float = 1.0  # env action units per unit of our action, on unbounded action dimensions
    success: str | None = None  # a termination term counted as success, e.g. "success"; None: never
    overrides: list[str] = field(default_factory=list)  # env-config overrides, e.g. "physics=newton_mjwarp"
    launcher_args: dict[str, Any] = field(default_factory=dict)  # launch_simulation's arguments; {}: headless


class IsaacLabVecEnv(VecEnv):
    """An Isaac Lab RL env (``ManagerBasedRLEnv`` or ``DirectRLEnv``, possibly gymnasium-wrapped) as a ``VecEnv``.

    Actions in [-1, 1] are mapped onto bounded dimensions of the env's action space affinely and multiplied by
    ``action_scale`` on unbounded ones (Isaac Lab's default ``Box(-inf, inf)``; its action terms apply their own
    scale and offset after this). Non-finite actions raise before anything reaches the simulator.

    Args:
        env: what ``gymnasium.make(task_id, cfg=env_cfg)`` returned; attributes are read from ``env.unwrapped``.
        action_scale: env units per unit of our action on unbounded action dimensions.
        success: the success signal for episode statistics: the name of a termination term of a manager-based
            env (e.g. ``"success"``), or a function of the unwrapped env returning bool [N] for the step just
            taken (it runs after Isaac Lab's reset, so it must read buffers computed in the step). None: never.
        instruction: the task's language instruction; defaults to the gymnasium id.
        on_close: called after the env is closed (``make_isaaclab_env`` ends the simulation runtime here).
    """

    def __init__(self, env: Any, action_scale: float = 1.0, success: str | SuccessFn | None = None,
                 instruction: str | None = None, on_close: Callable[[], None] | None = None) -> None:
        base = env.unwrapped
        self.env, self.base, self._on_close = env, base, on_close
        self.num_envs = int(base.num_envs)
        self.device = torch.device(base.device)
        self.max_episode_length = int(base.max_episode_length)
        self.control_dt = float(base.step_dt)
        spec = getattr(env, "spec", None)
        self.instructions = [instruction or (spec.id if spec is not None else type(base).__name__)] * self.num_envs
        self.obs_spec, self._groups = _obs_spec(base.single_observation_space)
        self.action_dim, self._low, self._high = _action_bounds(base.single_action_space, self.device)
        self._bounded = torch.isfinite(self._low) & torch.isfinite(self._high)
        self.action_scale = float(action_scale)
        self._finite_horizon = bool(getattr(base.cfg, "is_finite_horizon", False))
        self._success = _success_fn(base, success)
        self.episodes = EpisodeTracker(self.num_envs, self.device)
        self._nonfinite_rewards = torch.zeros((), dtype=torch.long, device=self.device)  # zeroed; counted over the run
        self._obs: Obs | None = None  # the last observation returned (None: reset() not called yet)
        self._warned_no_final_obs = False
        self._closed = False

    # ----------------------------------------------------------------------------------------------- reset
    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Obs, dict[str, Any]]:
        """Every env (Isaac Lab resets ended envs inside its step; ``env_ids`` other than all is refused)."""
        if env_ids is not None and torch.as_tensor(env_ids).unique().numel() != self.num_envs:
            raise NotImplementedError("IsaacLabVecEnv resets every env at once (Isaac Lab auto-resets ended envs)")
        # keyword only: ManagerBasedEnv.reset's first positional parameter is env_ids. Isaac Lab's seed() seeds
        # python, numpy, torch and warp globally (isaaclab/utils/seed.py: configure_seed).
        obs_dict, _ = self.env.reset(seed=seed)
        self.episodes.reset()
        self._obs = self._convert(obs_dict)
        return self._obs, {keys.LOG: {}}

    # ------------------------------------------------------------------------------------------------ step
    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None
             ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        applied, _ = sanitize_action(action, self.num_envs, self.action_dim, self.device)  # non-finite: raises
        a = applied
        a = torch.where(self._bounded, self._low + 0.5 * (a + 1.0) * (self._high - self._low), self.action_scale * a)
        prev_obs = self._obs
        obs_dict, reward, terminated, time_outs, extras = self.env.step(a)

        obs = self._convert(obs_dict)
        # Isaac Lab keeps these in buffers it rewrites in place next step: the comparisons below make copies.
        terminated, time_outs = terminated.to(self.device) != 0, time_outs.to(self.device) != 0
        if self._finite_horizon:
            terminated = terminated | time_outs
        truncated = time_outs & ~terminated
        reward = reward.to(self.device, torch.float32)
        bad_reward = ~torch.isfinite(reward)
        reward = torch.where(bad_reward, torch.zeros_like(reward), reward)
        self._nonfinite_rewards += bad_reward.sum()
        success = self._success(self.base).to(self.device) != 0 if self._success else torch.zeros_like(terminated)
        self.episodes.add(reward, success)

        done = terminated | truncated
        info: dict[str, Any] = {keys.SUCCESS: success, keys.APPLIED_ACTION: applied,
                                keys.ACTOR: actor_ids(actor, self.num_envs, self.device)}
        scalars = {"reward/total": reward.mean(), "sim/nonfinite_rewards": self._nonfinite_rewards}
        if bool(done.any()):
            info[keys.FINAL_OBS] = self._final_obs(obs, extras.pop("final_obs", None), prev_obs, done)
            info[keys.EPISODE] = self.episodes.stats()
            self.episodes.reset(done)  # a bool mask: no device sync
            scalars.update({LOG_PREFIX + k: v for k, v in extras.get("log", {}).items()})
        else:
            info[keys.FINAL_OBS] = obs
        info[keys.LOG] = _floats(scalars)
        self._obs = obs
        return obs, reward, terminated, truncated, info

    def _final_obs(self, obs: Obs, final: dict[str, torch.Tensor] | None, prev_obs: Obs, done: torch.Tensor) -> Obs:
        """Rows of ended envs: Isaac Lab's pre-reset observation; other rows equal ``obs``."""
        if final is not None:
            source = self._convert(final)
        else:
            # Without extras["final_obs"] (cfg.compute_final_obs off, or a version without it) the terminal
            # observation is lost; the observation the last action was taken in is the nearest we have (rsl_rl
            # bootstraps time-outs from that step's value estimate for the same reason).
            if not self._warned_no_final_obs:
                log.warning("Isaac Lab gave no extras['final_obs'] (set env_cfg.compute_final_obs = True): "
                            "time-outs bootstrap from the previous observation")
                self._warned_no_final_obs = True
            source = prev_obs
        return {k: torch.where(done.view(-1, *[1] * (v.dim() - 1)), source[k].to(v.device, v.dtype), v)
                for k, v in obs.items()}

    def _convert(self, obs_dict: dict[str, Any]) -> Obs:
        """Isaac Lab's observation groups -> ours (see the module docstring); non-finite values become 0."""
        out = {}
        for ours, theirs in self._groups.items():
            v = obs_dict[theirs].to(self.device, self.obs_spec.dtype(ours))
            out[ours] = torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0) if v.is_floating_point() else v
        return out

    # Not resumable (VecEnv.resumable is False): Isaac Lab's simulation state cannot be saved, so a checkpoint of a
    # run on it holds the learner and no env state, and resuming it is refused (start a new run; the checkpoint's
    # exported policy still loads).

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.env.close()
        finally:
            if self._on_close is not None:
                self._on_close()


def _obs_spec(space: Any) -> tuple[ObsSpec, dict[str, str]]:
    """Our ObsSpec from Isaac Lab's ``single_observation_space`` (a Dict of groups), and our group -> theirs."""
    if not isinstance(space, gymnasium.spaces.Dict) or keys.POLICY not in space.spaces:
        raise TypeError(f"expected Isaac Lab's single_observation_space: a gymnasium Dict with a 'policy' group, "
                        f"got {space!r}")
    shapes, dtypes, groups = {}, {}, {}
    for name, sub in space.spaces.items():
        if not isinstance(sub, gymnasium.spaces.Box):
            if name in (keys.POLICY, keys.CRITIC):
                raise TypeError(f"observation group {name!r} is a {type(sub).__name__}, not a Box: set "
                                f"concatenate_terms=True on that group of the task's observation config")
            log.warning("Isaac Lab observation group %r (%s) is not a Box; it is dropped", name, type(sub).__name__)
            continue
        shapes[name], groups[name] = tuple(int(d) for d in sub.shape), name
        dtypes[name] = torch.uint8 if sub.dtype.kind == "u" else torch.float32
    if keys.CRITIC not in groups:  # no privileged group: the critic sees what the policy sees
        shapes[keys.CRITIC], dtypes[keys.CRITIC] = shapes[keys.POLICY], dtypes[keys.POLICY]
        groups[keys.CRITIC] = keys.POLICY
    return ObsSpec(shapes, dtypes), groups


def _action_bounds(space: Any, device: torch.device) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Action dim A and the bounds [A] of a flat Box action space (±inf where unbounded)."""
    if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) != 1:
        raise TypeError(f"IsaacLabVecEnv needs a flat Box action space, got {space!r}")
    low = torch.as_tensor(space.low, dtype=torch.float32, device=device)
    high = torch.as_tensor(space.high, dtype=torch.float32, device=device)
    return int(space.shape[0]), low, high


def _success_fn(base: Any, success: str | SuccessFn | None) -> SuccessFn | None:
    if success is None or callable(success):
        return success
    manager = getattr(base, "termination_manager", None)
    if manager is None:
        raise ValueError(f"success={success!r} names a termination term, but {type(base).__name__} has no "
                         "termination_manager (a DirectRLEnv?): pass a function of the env instead")
    if success not in manager.active_terms:
        raise ValueError(f"success={success!r} is not a termination term; the task has {manager.active_terms}")
    # TerminationManager.get_term: this step's value, kept through the same-step reset.
    return lambda env: env.termination_manager.get_term(success)


def _floats(scalars: dict[str, Any]) -> dict[str, float]:
    """Logger scalars as floats, with one device sync for all tensors."""
    tensors = {k: v for k, v in scalars.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in scalars.items() if k not in tensors}
    if tensors:
        values = torch.stack([v.detach().float().mean().to(next(iter(tensors.values())).device)
                              for v in tensors.values()]).tolist()
        out.update(zip(tensors, values))
    return out


def make_isaaclab_env(task_id: str, num_envs: int, device: str = "cuda:0", overrides: Sequence[str] = (),
                      seed: int | None = None, launcher_args: dict[str, Any] | None = None,
                      action_scale: float = 1.0, success: str | SuccessFn | None = None) -> IsaacLabVecEnv:
    """Build a registered Isaac Lab task the way Isaac Lab's scripts do, wrapped as our ``VecEnv``.

    ``parse_env_cfg`` (task defaults + Hydra-style ``overrides`` such as ``"physics=newton_mjwarp"``), then
    ``launch_simulation`` (starts Isaac Sim's Kit only when the config needs it; nothing for kitless Newton),
    then ``gymnasium.make(task_id, cfg=env_cfg)``. The runtime is shut down when the env is closed.

    Args:
        task_id: a gymnasium id registered by ``isaaclab_tasks``, e.g. ``"Isaac-Cartpole"``.
        num_envs: N.
        device: the simulation device, e.g. ``"cuda:0"`` or ``"cpu"``.
        overrides: Hydra-style ``key=value`` overrides of the task config.
        seed: written to ``env_cfg.seed`` (Isaac Lab seeds its RNGs with it at construction).
        launcher_args: arguments of ``launch_simulation`` (``headless``, ``physics``, ...); default headless.
        action_scale: see ``IsaacLabVecEnv``.
        success: see ``IsaacLabVecEnv``.
    """
    try:
        import isaaclab_tasks  # noqa: F401 - registers the Isaac-* gymnasium ids
        from isaaclab.app import launch_simulation
        from isaaclab_tasks.utils import parse_env_cfg
    except ImportError as e:
        raise ImportError(f"make_isaaclab_env needs Isaac Lab (`pip install isaaclab`, Python 3.12): {e}") from e
    env_cfg = parse_env_cfg(task_id, device=device, num_envs=num_envs, overrides=list(overrides))
    if hasattr(env_cfg, "compute_final_obs"):  # (Isaac Lab 3.0.0 has it) the true terminal obs, for bootstrapping
        env_cfg.compute_final_obs = True
    if seed is not None:
        env_cfg.seed = seed
    runtime = contextlib.ExitStack()
    runtime.enter_context(launch_simulation(env_cfg, dict(launcher_args or {"headless": True})))
    try:
        env = gymnasium.make(task_id, cfg=env_cfg)
    except BaseException:
        runtime.close()
        raise
    return IsaacLabVecEnv(env, action_scale=action_scale, success=success, instruction=task_id,
                          on_close=runtime.close)
