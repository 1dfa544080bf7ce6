"""A tiny pure-torch VecEnv for learner tests: a 1-D point mass to be driven to the origin."""

from __future__ import annotations

from typing import Any

import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec, VecEnv, actor_ids, sanitize_action


class PointMassEnv(VecEnv):
    """x' = x + 0.1·a, reward −|x|, success (terminated) when |x| < 0.05, time limit 40 steps.

    The critic group adds the step count (privileged: the actor does not see time).
    """

    resumable = True

    def __init__(self, num_envs: int = 64, seed: int = 0, device: str = "cpu") -> None:
        self.num_envs, self.device, self.action_dim = num_envs, torch.device(device), 1
        self.max_episode_length, self.control_dt = 40, 0.1
        self.instructions = ["go to the origin"] * num_envs
        self.obs_spec = ObsSpec({keys.POLICY: (1,), keys.CRITIC: (2,)})
        self.gen = torch.Generator().manual_seed(seed)
        dev = self.device
        self.x = torch.zeros(num_envs, device=dev)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=dev)
        self.ret = torch.zeros(num_envs, device=dev)
        self.succ = torch.zeros(num_envs, dtype=torch.bool, device=dev)

    def _obs(self) -> Obs:
        return {keys.POLICY: self.x[:, None].clone(),
                keys.CRITIC: torch.stack([self.x, self.t.float() / self.max_episode_length], 1)}

    def _reset(self, ids: torch.Tensor) -> None:
        u = torch.rand(2, len(ids), generator=self.gen).to(self.device)  # CPU generator: the same draws anywhere
        self.x[ids] = torch.where(u[0] < 0.5, -1.0, 1.0) * (0.3 + 0.7 * u[1])
        self.t[ids], self.ret[ids], self.succ[ids] = 0, 0.0, False

    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Obs, dict[str, Any]]:
        if seed is not None:
            self.gen.manual_seed(seed)
        self._reset(torch.arange(self.num_envs, device=self.device) if env_ids is None else env_ids)
        return self._obs(), {keys.LOG: {}}

    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None):
        applied, _ = sanitize_action(action, self.num_envs, 1, self.device)
        a = applied[:, 0]
        self.x = self.x + 0.1 * a
        self.t += 1
        reward = -self.x.abs()
        success = self.x.abs() < 0.05
        terminated = success.clone()
        truncated = (self.t >= self.max_episode_length) & ~terminated
        self.ret += reward
        self.succ |= success
        obs = self._obs()
        done = terminated | truncated
        info: dict[str, Any] = {keys.SUCCESS: success, keys.LOG: {"reward/distance": float(reward.mean())},
                                keys.FINAL_OBS: {k: v.clone() for k, v in obs.items()}, keys.APPLIED_ACTION: applied,
                                keys.ACTOR: actor_ids(actor, self.num_envs, self.device)}
        info[keys.EPISODE] = {keys.EP_RETURN: self.ret.clone(), keys.EP_LENGTH: self.t.clone(),
                              keys.EP_SUCCESS: self.succ.clone()}
        ids = done.nonzero().flatten()
        if len(ids):
            self._reset(ids)
            new = self._obs()
            for k in obs:
                obs[k][ids] = new[k][ids]
        return obs, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        return {"x": self.x.clone(), "t": self.t.clone(), "ret": self.ret.clone(), "succ": self.succ.clone(),
                "gen": self.gen.get_state()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.x, self.t = sd["x"].to(self.device), sd["t"].to(self.device)
        self.ret, self.succ = sd["ret"].to(self.device), sd["succ"].to(self.device)
        self.gen.set_state(sd["gen"])
