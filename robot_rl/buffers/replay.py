"""The off-policy store: a preallocated device ring of transitions, sampled uniformly with n-step windows.

Layout: ``[T, N, ...]`` with N the number of envs and T = ⌈capacity / N⌉ rows, one row per vector step, so
the transitions of one env are consecutive in time along T and n-step windows are plain index arithmetic. The
true next observation of every transition is stored (``info["final_obs"]`` where the episode ended), so
time-outs bootstrap from the real last observation and never from the first observation of the next episode.
A transition where the env faulted (``keys.FAULTED``: non-finite or diverged state, its reward and observation
meaningless) is kept but never sampled, and the env's transition before it is marked truncated, so n-step windows
stop there and bootstrap from the last sound observation instead of learning an end with reward 0 (RELIABILITY D1).
Every transition keeps who chose its action (``keys.ACTOR``: the policy, a person, a recovery policy), so a learner
can weigh or draw interventions apart (DESIGN.md §5: interventions feed the RLPD buffers).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch

from policies import keys
from robot_rl import returns

Batch = dict[str, Any]


class Source(Protocol):
    """What ``sample_mixed`` draws RLPD's offline half from: a ``ReplayBuffer`` (demos), or the interventions of the
    online one (``robot_rl.buffers.interventions``)."""

    @property
    def size(self) -> int:
        """0 when there is nothing to draw."""

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99) -> Batch:
        ...


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
        self.faulted = torch.zeros(t, n, dtype=torch.bool, device=self.device)
        self.actor = torch.full((t, n), keys.ACTOR_POLICY, dtype=torch.int8, device=self.device)
        self._fault_rows: set[int] = set()  # rows holding a faulted transition (host-side: sampling checks only then)
        self.pos = 0  # next row written
        self.size = 0  # rows holding data

    @property
    def num_transitions(self) -> int:
        return self.size * self.num_envs

    def add(self, obs: dict[str, torch.Tensor], action: torch.Tensor, reward: torch.Tensor,
            terminated: torch.Tensor, truncated: torch.Tensor, next_obs: dict[str, torch.Tensor],
            final_obs: dict[str, torch.Tensor] | None = None, faulted: torch.Tensor | None = None,
            actor: torch.Tensor | None = None) -> None:
        """Store one vector step: obs groups [N, ...], action [N, A], the rest [N].

        ``next_obs`` is what ``env.step`` returned (the first observation of a new episode where one ended);
        ``final_obs`` (``info["final_obs"]``) replaces it in the rows of envs that ended, so every stored o' is
        the observation the action really led to. ``faulted`` [N] bool (``info[keys.FAULTED]``; None: none did):
        those transitions are never sampled (module docstring). ``actor`` [N] int (``info[keys.ACTOR]``; None: the
        policy) is who chose each action.
        """
        r = self.pos
        self._fault_rows.discard(r)  # the row overwritten
        if faulted is not None and bool(faulted.any()):
            faulted = faulted.to(self.device)
            self.faulted[r].copy_(faulted)
            self._fault_rows.add(r)
            if self.size:  # the env's previous transition, if the same episode, now ends there as a time-out
                prev = (r - 1) % self.rows
                self.truncated[prev] |= faulted & ~(self.terminated[prev] | self.truncated[prev])
        else:
            self.faulted[r].fill_(False)
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
        if actor is None:
            self.actor[r].fill_(keys.ACTOR_POLICY)
        else:
            self.actor[r].copy_(actor)
        self.pos = (self.pos + 1) % self.rows
        self.size = min(self.size + 1, self.rows)

    def cut_episodes(self) -> None:
        """End every episode the newest row left running as a time-out: what follows in each env's column belongs
        to another episode (a remote actor replaced by a new process with new envs). n-step windows stop there."""
        if self.size:
            r = (self.pos - 1) % self.rows
            self.truncated[r] |= ~self.terminated[r]

    @property
    def num_interventions(self) -> int:
        """Stored transitions whose action someone other than the policy chose (a person, a recovery policy)."""
        return int((self._filled_actor() != keys.ACTOR_POLICY).sum())

    def _filled_actor(self) -> torch.Tensor:
        """``actor`` [rows, N] of the rows written so far: until the ring wraps they are rows 0..size-1 (a scan
        of the rest, all the policy's, would be most of a large buffer)."""
        return self.actor[:self.size] if self.size < self.rows else self.actor

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99, interventions: bool = False) -> Batch:
        """Uniform transitions with n-step targets (``returns.nstep_targets``), cut at episode ends and at the
        newest row (a window running past it is shortened, never filled with stale rows). ``interventions``: draw
        only among the transitions someone other than the policy chose (their n-step windows run on into whatever
        followed them).

        Returns:
            ``obs`` / ``next_obs`` (group -> [B, ...]; o' is the one after the last step kept), ``action``
            [B, A], ``reward`` [B] (Σ γ^k r_{t+k}), ``discount`` [B] (γ^m · (1 − terminated)), ``keys.ACTOR``
            int8 [B] who chose the action.
        """
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        n = self.num_envs
        oldest = (self.pos - self.size) % self.rows
        if interventions:  # flat positions (rows after the oldest * N + env) of the transitions to draw among
            rows_, envs_ = (self._filled_actor() != keys.ACTOR_POLICY).nonzero(as_tuple=True)
            pool = ((rows_ - oldest) % self.rows) * n + envs_
            if len(pool) == 0:
                raise RuntimeError("the replay buffer holds no intervention to sample")

            def draw(k: int) -> torch.Tensor:
                return pool[torch.randint(len(pool), (k,), device=self.device)]
        else:
            def draw(k: int) -> torch.Tensor:
                return torch.randint(self.size * n, (k,), device=self.device)
        flat = draw(batch_size)
        if self._fault_rows:  # draw again where a faulted transition was drawn (they are rare; the stream is
            # unchanged while none is stored)
            for _ in range(100):
                bad = self.faulted[(oldest + flat // n) % self.rows, flat % n]
                if not bool(bad.any()):
                    break
                flat = torch.where(bad, draw(batch_size), flat)
            else:
                raise RuntimeError("replay: could not draw transitions that did not fault (nearly all of them did)")
        offset, env = flat // n, flat % n  # offset: rows after the oldest one
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
                keys.ACTOR: self.actor[start, env],
                keys.NEXT_OBS: {k: v[last_row, env] for k, v in self.next_obs.items()}}

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The filled rows (in storage order) plus the write position: enough to continue bitwise."""
        s = self.size
        return {"obs": {k: v[:s] for k, v in self.obs.items()},
                "next_obs": {k: v[:s] for k, v in self.next_obs.items()},
                "action": self.action[:s], "reward": self.reward[:s], "terminated": self.terminated[:s],
                "truncated": self.truncated[:s], "faulted": self.faulted[:s], "actor": self.actor[:s], "pos": self.pos,
                "size": self.size,
                "rows": self.rows,
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
        self.faulted.zero_()
        if "faulted" in sd:  # absent from checkpoints written before faulted transitions were kept out
            self.faulted[:s].copy_(sd["faulted"])
        self.actor.fill_(keys.ACTOR_POLICY)
        if "actor" in sd:  # absent from checkpoints written before the actor was kept
            self.actor[:s].copy_(sd["actor"])
        self._fault_rows = {int(r) for r in self.faulted.any(dim=1).nonzero().flatten().tolist()}
        self.pos, self.size = int(sd["pos"]), s


def sample_mixed(online: ReplayBuffer, demo: Source | None, batch_size: int, demo_fraction: float,
                 n_step: int = 1, gamma: float = 0.99) -> Batch:
    """RLPD-style symmetric sampling: round(B · demo_fraction) transitions from ``demo``, the rest from
    ``online``, concatenated (online first). Without a demo buffer (or an empty one) all come from ``online``."""
    n_demo = 0 if demo is None or demo.size == 0 else round(batch_size * demo_fraction)
    if n_demo == 0:
        return online.sample(batch_size, n_step, gamma)
    if n_demo >= batch_size:
        return demo.sample(batch_size, n_step, gamma)
    return concat_batches(online.sample(batch_size - n_demo, n_step, gamma), demo.sample(n_demo, n_step, gamma))


def concat_batches(a: Batch, b: Batch) -> Batch:
    """Two batches of the same keys (nested dicts of tensors) as one, ``a``'s rows first."""
    return {k: concat_batches(a[k], b[k]) if isinstance(a[k], dict) else torch.cat([a[k], b[k]]) for k in a}
