"""The algorithm interface the runners program against (DESIGN.md §3).

An algorithm owns its critics, targets, optimizers and value models, learns from batches handed to it by a
sampler (a rollout buffer, a replay buffer, a dataset), and never steps an env. Runners read only what is declared
here; everything else (γ, λ, batch sizes, networks) is the algorithm's own business.

    OnPolicyAlgorithm:  act(obs) -> (action, extras) · bootstrap_time_outs · finish_rollout(buffer, obs) · update
    OffPolicyAlgorithm: act(obs) · random_action(n) · observe(...) · update(replay, demo) + its replay schedule
    OfflineAlgorithm:   update(batch)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from policies import Policy
from robot_rl.distributed import ProcessGroup

Obs = dict[str, torch.Tensor]


class Algorithm(ABC):
    """What every learner exposes: the policy it trains (exported alone), its device, the observation groups it
    reads, train/eval modes, ``update`` and its resumable state."""

    name: ClassVar[str]
    policy: Policy
    device: torch.device
    # Keys of ``state_dict`` that hold this process's own state (its envs' exploration noise, statistics of its own
    # envs): data-parallel, every rank's are checkpointed and they are left out of the check that the ranks agree.
    rank_state_keys: ClassVar[tuple[str, ...]] = ()

    @property
    @abstractmethod
    def obs_groups(self) -> list[str]:
        """Observation groups the learner reads (what buffers must store)."""

    @abstractmethod
    def train_mode(self) -> None: ...

    @abstractmethod
    def eval_mode(self) -> None: ...

    @abstractmethod
    def update(self, *batches: Any) -> dict[str, Any]:
        """One learning step on what the sampler(s) give; returns scalars (floats or 0-d tensors) to log."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bitwise (networks, optimizers, schedules, counters)."""

    @abstractmethod
    def load_state_dict(self, sd: dict[str, Any]) -> None: ...

    def distribute(self, group: ProcessGroup) -> None:
        """Train data-parallel in ``group`` (``robot_rl.distributed``): take rank 0's weights and average every
        update over the ranks from now on. A learner that cannot refuses, naming itself."""
        raise ValueError(f"algo={self.name} does not train data-parallel (over torchrun processes); run it in one "
                         "process")


class OnPolicyAlgorithm(Algorithm):
    """Learns from rollouts ``[T, N, ...]`` collected by its current policy."""

    @property
    @abstractmethod
    def rollout_fields(self) -> dict[str, tuple[int, ...]]:
        """Per-step extras ``act`` returns and the rollout buffer stores: name -> per-env shape."""

    @abstractmethod
    def act(self, obs: Obs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(action [N, A] to send, extras {name: [N, ...]} to store) for a batch of observations."""

    @abstractmethod
    def bootstrap_time_outs(self, reward: torch.Tensor, truncated: torch.Tensor, final_obs: Obs) -> torch.Tensor:
        """The reward [N] to store, with time-outs bootstrapped as the algorithm decides."""

    @abstractmethod
    def finish_rollout(self, buffer: Any, last_obs: Obs) -> None:
        """Complete a full buffer before ``update`` (returns, advantages), given the observation after it."""


class OffPolicyAlgorithm(Algorithm):
    """Learns from a replay buffer; the runner fills it on the schedule the algorithm declares."""

    @property
    @abstractmethod
    def replay_capacity(self) -> int:
        """Transitions the replay buffer keeps (summed over envs)."""

    @property
    @abstractmethod
    def learning_starts(self) -> int:
        """Transitions collected with ``random_action`` before learning starts."""

    @property
    @abstractmethod
    def updates_per_step(self) -> float:
        """Gradient updates per vector env step (fractions accumulate)."""

    @abstractmethod
    def act(self, obs: Obs) -> torch.Tensor:
        """Exploration actions [N, A] in [-1, 1]."""

    @abstractmethod
    def random_action(self, num_envs: int) -> torch.Tensor:
        """Uniform actions [N, A] for the warm-up."""

    def set_num_envs(self, num_envs: int) -> None:
        """Size the per-env state (exploration noise, return statistics) for ``num_envs`` envs before training (a
        remote learner sees every actor's envs). Default: the algorithm keeps none."""

    def observe(self, reward: torch.Tensor, terminated: torch.Tensor,
                truncated: torch.Tensor, envs: slice | None = None) -> None:
        """See each step's outcome (reward scaling statistics, per-env exploration noise) of all envs, or of the
        slice ``envs`` of them (a remote learner: one actor's envs)."""


class OfflineAlgorithm(Algorithm):
    """Learns from batches of logged data: no env, no collection."""

    @property
    def export_policy(self) -> Policy:
        """The policy a run exports and evaluates (the trained one; an algorithm may export, e.g., a weight average)."""
        return self.policy
