"""The on-policy rollout store: preallocated ``[T, N, ...]`` tensors on one device, filled step by step."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from robot_rl import returns


class RolloutBuffer:
    """T steps of N envs: observations (one tensor per group), actions, rewards, dones and the extras the
    collecting algorithm declares (``OnPolicyAlgorithm.rollout_fields``: PPO stores log π, V, μ, σ).

    Row ``t`` holds ``(o_t, a_t, r_t, done_t, extras_t)``; ``r_t`` already includes the time-out bootstrap
    (``returns.bootstrap_time_outs``). ``advantages`` and ``returns`` [T, N] are filled by ``compute_returns``.
    ``valid`` [T, N] is False where the env faulted on that step (``keys.FAULTED``): the learner keeps those samples
    out of its loss (``has_invalid``; minibatches then carry a 0/1 ``weight``). Nothing is allocated after
    construction.

    Args:
        num_steps: T, steps per env per rollout.
        num_envs: N.
        obs_shapes: observation group -> per-env shape, for the groups the learner reads.
        action_dim: A.
        device: where every tensor lives (the env's / learner's device).
        obs_dtypes: optional group -> dtype (float32 by default; uint8 for images).
        extras: name -> per-env shape of the algorithm's per-step extras (float32).
    """

    def __init__(self, num_steps: int, num_envs: int, obs_shapes: dict[str, tuple[int, ...]], action_dim: int,
                 device: torch.device | str, obs_dtypes: dict[str, torch.dtype] | None = None,
                 extras: dict[str, tuple[int, ...]] | None = None) -> None:
        if num_steps < 1 or num_envs < 1:
            raise ValueError(f"num_steps and num_envs must be >= 1, got {num_steps}, {num_envs}")
        self.num_steps, self.num_envs, self.device = num_steps, num_envs, torch.device(device)
        dtypes = obs_dtypes or {}
        t, n = num_steps, num_envs
        self.obs = {k: torch.zeros(t, n, *s, dtype=dtypes.get(k, torch.float32), device=self.device)
                    for k, s in obs_shapes.items()}
        self.action = torch.zeros(t, n, action_dim, device=self.device)
        self.reward = torch.zeros(t, n, device=self.device)
        self.done = torch.zeros(t, n, dtype=torch.bool, device=self.device)
        self.valid = torch.ones(t, n, dtype=torch.bool, device=self.device)
        self.extras = {k: torch.zeros(t, n, *s, device=self.device) for k, s in (extras or {}).items()}
        self.advantages = torch.zeros(t, n, device=self.device)
        self.returns = torch.zeros(t, n, device=self.device)
        self.step = 0

    @property
    def full(self) -> bool:
        return self.step == self.num_steps

    def add(self, obs: dict[str, torch.Tensor], action: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
            extras: dict[str, torch.Tensor] | None = None, faulted: torch.Tensor | None = None) -> None:
        """Store one step of every env: obs groups [N, ...], action [N, A], reward and done [N], every declared
        extra [N, ...], and ``faulted`` [N] bool (``info[keys.FAULTED]``; None: no env faulted)."""
        if self.full:
            raise RuntimeError(f"rollout buffer is full ({self.num_steps} steps); call clear() after the update")
        extras = extras or {}
        if set(extras) != set(self.extras):
            raise KeyError(f"rollout extras {sorted(extras)} differ from the declared {sorted(self.extras)}")
        t = self.step
        for k, buf in self.obs.items():
            buf[t].copy_(obs[k])
        self.action[t].copy_(action)
        self.reward[t].copy_(reward)
        self.done[t].copy_(done)
        if faulted is None:
            self.valid[t].fill_(True)
        else:
            self.valid[t].copy_(~faulted)
        for k, buf in self.extras.items():
            buf[t].copy_(extras[k])
        self.step += 1

    def clear(self) -> None:
        self.step = 0

    def has_invalid(self) -> bool:
        """Whether any stored step faulted (one host read)."""
        return not bool(self.valid[:self.step].all())

    def compute_returns(self, values: torch.Tensor, last_value: torch.Tensor, gamma: float, lam: float) -> None:
        """Fill ``advantages`` and ``returns`` [T, N] by GAE from the values [T, N] of the stored observations
        and ``last_value`` [N] = V(o_T)."""
        if not self.full:
            raise RuntimeError(f"rollout holds {self.step}/{self.num_steps} steps; fill it before computing returns")
        adv, ret = returns.gae(self.reward, values, self.done, last_value, gamma, lam)
        self.advantages.copy_(adv)
        self.returns.copy_(ret)

    def minibatches(self, num_minibatches: int) -> Iterator[dict[str, torch.Tensor | dict[str, torch.Tensor]]]:
        """One shuffled pass over the T·N samples in ``num_minibatches`` flat batches [B, ...]: ``obs`` (a dict),
        ``action``, ``advantages``, ``returns`` and every extra by its name; ``weight`` (1.0, 0.0 where the env
        faulted) only when some step did.

        Shuffling draws from torch's default generator of the buffer's device (saved in checkpoints).
        """
        total = self.num_steps * self.num_envs
        if not 1 <= num_minibatches <= total:
            raise ValueError(f"num_minibatches must be in [1, {total}], got {num_minibatches}")
        size = total // num_minibatches
        perm = torch.randperm(total, device=self.device)[:size * num_minibatches]
        # One gather per field and pass, then the minibatches are slices of it (the same rows as indexing each
        # minibatch by its part of the permutation, with a quarter of the ops at 4 minibatches).
        fields = {"action": self.action, "advantages": self.advantages, "returns": self.returns, **self.extras}
        if self.has_invalid():  # faulted steps weigh 0 in the loss (only then: the usual path stays as it was)
            fields["weight"] = self.valid.float()
        shuffled = {k: v.flatten(0, 1)[perm] for k, v in fields.items()}
        shuffled_obs = {k: v.flatten(0, 1)[perm] for k, v in self.obs.items()}
        for i in range(num_minibatches):
            rows = slice(i * size, (i + 1) * size)
            batch: dict[str, torch.Tensor | dict[str, torch.Tensor]] = {k: v[rows] for k, v in shuffled.items()}
            batch["obs"] = {k: v[rows] for k, v in shuffled_obs.items()}
            yield batch
