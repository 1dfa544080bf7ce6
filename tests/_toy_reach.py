"""A tiny pure-torch 2-D reaching VecEnv for off-policy learner tests (so101_reach in miniature)."""

from __future__ import annotations

from typing import Any

import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec, VecEnv, actor_ids, sanitize_action


class PointReach2D(VecEnv):
    """A 2-D point driven to a random goal: pos' = clip(pos + 0.2·a, ±1.5), reward −‖goal − pos‖ + 5·success,
    success (terminated) within 0.1, time limit 30 steps. obs: [pos, goal, goal − pos]; the critic adds the time."""

    resumable = True

    def __init__(self, num_envs: int = 16, seed: int = 0) -> None:
        self.num_envs, self.device, self.action_dim = num_envs, torch.device("cpu"), 2
        self.max_episode_length, self.control_dt = 30, 0.1
        self.instructions = ["reach the goal"] * num_envs
        self.obs_spec = ObsSpec({keys.POLICY: (6,), keys.CRITIC: (7,)})
        self.gen = torch.Generator().manual_seed(seed)
        self.pos, self.goal = torch.zeros(num_envs, 2), torch.zeros(num_envs, 2)
        self.t = torch.zeros(num_envs, dtype=torch.long)
        self.ret, self.succ = torch.zeros(num_envs), torch.zeros(num_envs, dtype=torch.bool)

    def _obs(self) -> Obs:
        x = torch.cat([self.pos, self.goal, self.goal - self.pos], 1)
        return {keys.POLICY: x, keys.CRITIC: torch.cat([x, self.t[:, None].float() / self.max_episode_length], 1)}

    def _reset(self, ids: torch.Tensor) -> None:
        self.pos[ids] = torch.rand(len(ids), 2, generator=self.gen) * 2 - 1
        self.goal[ids] = torch.rand(len(ids), 2, generator=self.gen) * 2 - 1
        self.t[ids], self.ret[ids], self.succ[ids] = 0, 0.0, False

    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Obs, dict[str, Any]]:
        if seed is not None:
            self.gen.manual_seed(seed)
        self._reset(torch.arange(self.num_envs) if env_ids is None else env_ids)
        return self._obs(), {keys.LOG: {}}

    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None
             ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        a = sanitize_action(action, self.num_envs, 2, self.device)[0]
        self.pos = (self.pos + 0.2 * a).clamp(-1.5, 1.5)
        self.t += 1
        dist = torch.linalg.norm(self.goal - self.pos, dim=1)
        success = dist < 0.1
        reward = -dist + 5.0 * success.float()
        terminated = success.clone()
        truncated = (self.t >= self.max_episode_length) & ~terminated
        self.ret += reward
        self.succ |= success
        obs = self._obs()
        info: dict[str, Any] = {
            keys.SUCCESS: success,
            keys.LOG: {"reward/distance": float(-dist.mean())},
            keys.FINAL_OBS: {k: v.clone() for k, v in obs.items()},
            keys.APPLIED_ACTION: a,
            keys.ACTOR: actor_ids(actor, self.num_envs, self.device),
            keys.EPISODE: {
                keys.EP_RETURN: self.ret.clone(),
                keys.EP_LENGTH: self.t.clone(),
                keys.EP_SUCCESS: self.succ.clone(),
            },
        }
        ids = (terminated | truncated).nonzero().flatten()
        if len(ids):
            self._reset(ids)
            new = self._obs()
            for k in obs:
                obs[k][ids] = new[k][ids]
        return obs, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        return {
            "pos": self.pos.clone(),
            "goal": self.goal.clone(),
            "t": self.t.clone(),
            "ret": self.ret.clone(),
            "succ": self.succ.clone(),
            "gen": self.gen.get_state(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.pos, self.goal, self.t = sd["pos"].clone(), sd["goal"].clone(), sd["t"].clone()
        self.ret, self.succ = sd["ret"].clone(), sd["succ"].clone()
        self.gen.set_state(sd["gen"])
