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
from robot_rl.env import Obs, ObsSpec, VecEnv, check_action


class GymVecEnv(VecEnv):
    """N copies of one gymnasium env id, auto-reset inside ``step`` with the true final observation in info.

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
        self.instruction = env_id
        self._ret = np.zeros(num_envs)
        self._len = np.zeros(num_envs, dtype=np.int64)
        self._succ = np.zeros(num_envs, dtype=bool)

    def _obs(self, rows: list[np.ndarray]) -> Obs:
        x = torch.as_tensor(np.stack(rows).reshape(self.num_envs, -1), dtype=torch.float32, device=self.device)
        return {keys.POLICY: x, keys.CRITIC: x}

    def reset(self, seed: int | None = None) -> tuple[Obs, dict[str, Any]]:
        base = self.seed if seed is None else seed
        rows = [env.reset(seed=base + i)[0] for i, env in enumerate(self.envs)]
        self._ret[:], self._len[:], self._succ[:] = 0.0, 0, False
        return self._obs(rows), {keys.LOG: {}}

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        a = check_action(action, self.num_envs, self.action_dim).clamp(-1.0, 1.0).cpu().double().numpy()
        a = self.low + 0.5 * (a + 1.0) * (self.high - self.low)
        rows, finals = [], []
        reward, term, trunc = np.zeros(self.num_envs), np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        success = np.zeros(self.num_envs, dtype=bool)
        n = self.num_envs
        ep_ret, ep_len, ep_succ = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, bool)
        for i, env in enumerate(self.envs):
            obs, r, te, tr, info = env.step(a[i].astype(env.action_space.dtype))
            reward[i], term[i], trunc[i] = r, te, tr and not te
            success[i] = bool(info.get("is_success", False))
            self._ret[i] += r
            self._len[i] += 1
            self._succ[i] |= success[i]
            ep_ret[i], ep_len[i], ep_succ[i] = self._ret[i], self._len[i], self._succ[i]
            finals.append(obs)
            if te or tr:
                obs = env.reset()[0]
                self._ret[i], self._len[i], self._succ[i] = 0.0, 0, False
            rows.append(obs)

        def t(x: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(x, device=self.device)

        info_out: dict[str, Any] = {
            keys.FINAL_OBS: self._obs(finals), keys.SUCCESS: t(success),
            keys.EPISODE: {keys.EP_RETURN: t(ep_ret).float(), keys.EP_LENGTH: t(ep_len), keys.EP_SUCCESS: t(ep_succ)},
            keys.LOG: {"reward/total": float(reward.mean())},
        }
        return self._obs(rows), t(reward).float(), t(term), t(trunc), info_out

    def close(self) -> None:
        for env in self.envs:
            env.close()
