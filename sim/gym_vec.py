"""Gymnasium envs behind our batched torch ``VecEnv`` contract (the reverse of ``sim/gym.py``), so our learners
train on standard benchmarks such as ``HalfCheetah-v5`` and ``Humanoid-v5``.

    env = GymVecEnv("HalfCheetah-v5", num_envs=4, seed=0)

N gymnasium envs stepped one after another in this process (gymnasium's MuJoCo envs are fast single-threaded;
``SyncVectorEnv`` is no faster here, DESIGN.md §4). Actions in [-1, 1] are mapped affinely onto the env's
``Box`` bounds. Observations appear as both the ``policy`` and the ``critic`` group.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch

from policies import keys
from robot_rl.env import EpisodeTracker, Obs, ObsSpec, VecEnv, actor_ids, sanitize_action


class GymVecEnv(VecEnv):
    """N copies of one gymnasium env id, auto-reset inside ``step`` with the true final observation in info.
    Not resumable (a gymnasium env's state cannot be saved generically).

    Args:
        env_id: a registered gymnasium id with flat ``Box`` observation and action spaces.
        num_envs: N.
        seed: seeds env i with ``seed + i`` at the first reset (later resets continue their own RNG).
        device: torch device of the tensors returned.
        make_kwargs: passed to ``gymnasium.make``.
    """

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, device: str = "cpu",
                 **make_kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.envs = [gymnasium.make(env_id, **make_kwargs) for _ in range(num_envs)]
        obs_space, act_space = self.envs[0].observation_space, self.envs[0].action_space
        if not (isinstance(obs_space, gymnasium.spaces.Box) and isinstance(act_space, gymnasium.spaces.Box)):
            raise TypeError(f"{env_id}: GymVecEnv needs Box observation and action spaces")
        self.num_envs, self.device, self.seed = num_envs, torch.device(device), seed
        dim = int(np.prod(obs_space.shape))
        self.obs_spec = ObsSpec({keys.POLICY: (dim,), keys.CRITIC: (dim,)})
        self.action_dim = int(np.prod(act_space.shape))
        self.low, self.high = act_space.low.astype(np.float64), act_space.high.astype(np.float64)
        spec = self.envs[0].spec
        self.max_episode_length = int(spec.max_episode_steps) if spec and spec.max_episode_steps else 1000
        self.control_dt = float(getattr(self.envs[0].unwrapped, "dt", 0.05))
        self.instructions = [env_id] * num_envs
        self.episodes = EpisodeTracker(num_envs, self.device)
        self._rows: list[np.ndarray] = []  # the last observation of each env

    def _obs(self, rows: list[np.ndarray]) -> Obs:
        x = torch.as_tensor(np.stack(rows).reshape(self.num_envs, -1), dtype=torch.float32, device=self.device)
        return {keys.POLICY: x, keys.CRITIC: x}

    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Obs, dict[str, Any]]:
        """Env i is seeded with ``seed + i``; ``seed`` None: the constructor's seed when every env is reset, each
        env's own RNG continued when ``env_ids`` picks some."""
        ids = range(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).flatten().tolist()
        if not self._rows and len(set(ids)) != self.num_envs:
            raise RuntimeError("the first reset() must reset every env (env_ids=None)")
        base = self.seed if seed is None and env_ids is None else seed
        rows = self._rows or [None] * self.num_envs
        for i in ids:
            rows[i] = self.envs[i].reset(seed=None if base is None else base + i)[0]
        self._rows = rows
        self.episodes.reset(None if env_ids is None else torch.as_tensor(ids, dtype=torch.long))
        return self._obs(rows), {keys.LOG: {}}

    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None
             ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        applied, _ = sanitize_action(action, self.num_envs, self.action_dim, self.device)  # non-finite: raises
        a = applied.cpu().double().numpy()
        a = self.low + 0.5 * (a + 1.0) * (self.high - self.low)
        rows, finals = [], []
        reward, term, trunc = np.zeros(self.num_envs), np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        success = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            obs, r, te, tr, info = env.step(a[i].astype(env.action_space.dtype))
            reward[i], term[i], trunc[i] = r, te, tr and not te
            success[i] = bool(info.get("is_success", False))
            finals.append(obs)
            if te or tr:
                obs = env.reset()[0]
            rows.append(obs)
        self._rows = rows

        def t(x: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(x, device=self.device)

        reward_t, term_t, trunc_t, success_t = t(reward).float(), t(term), t(trunc), t(success)
        self.episodes.add(reward_t, success_t)
        info_out: dict[str, Any] = {
            keys.FINAL_OBS: self._obs(finals), keys.SUCCESS: success_t, keys.APPLIED_ACTION: applied,
            keys.ACTOR: actor_ids(actor, self.num_envs, self.device), keys.LOG: {"reward/total": float(reward.mean())},
        }
        done = term_t | trunc_t
        if bool(done.any()):
            info_out[keys.EPISODE] = self.episodes.stats()
            self.episodes.reset(done)
        return self._obs(rows), reward_t, term_t, trunc_t, info_out

    def close(self) -> None:
        for env in self.envs:
            env.close()
