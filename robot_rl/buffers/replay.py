"""The off-policy store: a preallocated device ring of transitions, sampled uniformly with n-step windows.

Layout: ``[T, N, ...]`` with N the number of envs and T = ⌈capacity / N⌉ rows, one row per vector step, so
the transitions of one env are consecutive in time along T and n-step windows are plain index arithmetic. The
true next observation of every transition is stored (``info["final_obs"]`` where the episode ended), so
time-outs bootstrap from the real last observation and never from the first observation of the next episode.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from policies import keys
from robot_rl import returns

Batch = dict[str, Any]


class ReplayBuffer:
    """Ring buffer of ``(o, a, r, terminated, truncated, o')`` for N envs.

    Args:
        capacity: transitions kept over all envs (rounded up to a multiple of ``num_envs``).
        num_envs: N, transitions added per ``add``.
        obs_shapes: observation group -> per-env shape, for the groups the learner reads.
        action_dim: A.
        device: where every tensor lives (the learner's device).
        obs_dtypes: optional group -> dtype (float32 by default; uint8 for images).
    """

    def __init__(self, capacity: int, num_envs: int, obs_shapes: dict[str, tuple[int, ...]], action_dim: int,
                 device: torch.device | str, obs_dtypes: dict[str, torch.dtype] | None = None) -> None:
        if capacity < 1 or num_envs < 1:
            raise ValueError(f"replay capacity and num_envs must be >= 1, got {capacity}, {num_envs}")
        self.num_envs, self.device = num_envs, torch.device(device)
        self.rows = math.ceil(capacity / num_envs)  # T
        dtypes = obs_dtypes or {}
        t, n = self.rows, num_envs

        def obs_store() -> dict[str, torch.Tensor]:
            return {k: torch.zeros(t, n, *s, dtype=dtypes.get(k, torch.float32), device=self.device)
                    for k, s in obs_shapes.items()}

        self.obs, self.next_obs = obs_store(), obs_store()
        self.action = torch.zeros(t, n, action_dim, device=self.device)
        self.reward = torch.zeros(t, n, device=self.device)
        self.terminated = torch.zeros(t, n, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(t, n, dtype=torch.bool, device=self.device)
        self.pos = 0  # next row written
        self.size = 0  # rows holding data

    @property
    def num_transitions(self) -> int:
        return self.size * self.num_envs

    def add(self, obs: dict[str, torch.Tensor], action: torch.Tensor, reward: torch.Tensor,
            terminated: torch.Tensor, truncated: torch.Tensor, next_obs: dict[str, torch.Tensor],
            final_obs: dict[str, torch.Tensor] | None = None) -> None:
        """Store one vector step: obs groups [N, ...], action [N, A], the rest [N].

        ``next_obs`` is what ``env.step`` returned (the first observation of a new episode where one ended);
        ``final_obs`` (``info["final_obs"]``) replaces it in the rows of envs that ended, so every stored o' is
        the observation the action really led to.
        """
        r = self.pos
        done = terminated | truncated
        for k, buf in self.obs.items():
            buf[r].copy_(obs[k])
            nxt = next_obs[k]
            if final_obs is not None:
                nxt = torch.where(done.view(-1, *([1] * (nxt.dim() - 1))), final_obs[k], nxt)
            self.next_obs[k][r].copy_(nxt)
        self.action[r].copy_(action)
        self.reward[r].copy_(reward)
        self.terminated[r].copy_(terminated)
        self.truncated[r].copy_(truncated)
        self.pos = (self.pos + 1) % self.rows
        self.size = min(self.size + 1, self.rows)

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99) -> Batch:
        """Uniform transitions with n-step targets (``returns.nstep_targets``), cut at episode ends and at the
        newest row (a window running past it is shortened, never filled with stale rows).

        Returns:
            ``obs`` / ``next_obs`` (group -> [B, ...]; o' is the one after the last step kept), ``action``
            [B, A], ``reward`` [B] (Σ γ^k r_{t+k}), ``discount`` [B] (γ^m · (1 − terminated)).
        """
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        n = self.num_envs
        flat = torch.randint(self.size * n, (batch_size,), device=self.device)
        offset, env = flat // n, flat % n  # offset: rows after the oldest one
        oldest = (self.pos - self.size) % self.rows
        start = (oldest + offset) % self.rows
        ks = torch.arange(n_step, device=self.device)
        rows = (start[:, None] + ks) % self.rows  # [B, n]
        valid = (offset[:, None] + ks) < self.size
        envs = env[:, None].expand_as(rows)
        ret, discount, last = returns.nstep_targets(self.reward[rows, envs], self.terminated[rows, envs],
                                                    self.truncated[rows, envs], valid, gamma)
        last_row = rows.gather(1, last[:, None]).squeeze(1)
        return {keys.OBS: {k: v[start, env] for k, v in self.obs.items()},
                keys.ACTION: self.action[start, env], keys.REWARD: ret, "discount": discount,
                keys.NEXT_OBS: {k: v[last_row, env] for k, v in self.next_obs.items()}}

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The filled rows (in storage order) plus the write position: enough to continue bitwise."""
        s = self.size
        return {"obs": {k: v[:s] for k, v in self.obs.items()},
                "next_obs": {k: v[:s] for k, v in self.next_obs.items()},
                "action": self.action[:s], "reward": self.reward[:s], "terminated": self.terminated[:s],
                "truncated": self.truncated[:s], "pos": self.pos, "size": self.size, "rows": self.rows,
                "num_envs": self.num_envs}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if (int(sd["rows"]), int(sd["num_envs"])) != (self.rows, self.num_envs):
            raise ValueError(f"replay buffer shape differs: checkpoint has {sd['rows']} rows x {sd['num_envs']} "
                             f"envs, this buffer {self.rows} x {self.num_envs}")
        s = int(sd["size"])
        for name in ("obs", "next_obs"):
            for k, v in getattr(self, name).items():
                v[:s].copy_(sd[name][k])
        for name in ("action", "reward", "terminated", "truncated"):
            getattr(self, name)[:s].copy_(sd[name])
        self.pos, self.size = int(sd["pos"]), s


def sample_mixed(online: ReplayBuffer, demo: ReplayBuffer | None, batch_size: int, demo_fraction: float,
                 n_step: int = 1, gamma: float = 0.99) -> Batch:
    """RLPD-style symmetric sampling: round(B · demo_fraction) transitions from ``demo``, the rest from
    ``online``, concatenated (online first). Without a demo buffer (or an empty one) all come from ``online``."""
    n_demo = 0 if demo is None or demo.size == 0 else round(batch_size * demo_fraction)
    if n_demo == 0:
        return online.sample(batch_size, n_step, gamma)
    if n_demo >= batch_size:
        return demo.sample(batch_size, n_step, gamma)
    a, b = online.sample(batch_size - n_demo, n_step, gamma), demo.sample(n_demo, n_step, gamma)

    def cat(x: Any, y: Any) -> Any:
        return {k: cat(x[k], y[k]) for k in x} if isinstance(x, dict) else torch.cat([x, y])

    return cat(a, b)
