"""Earlier joint readings of live envs, for a model that reads ``keys.OBS_STATE_LAGS`` (the value model's
``state_lags``): what ``ChunkSampler.state_lags`` gives for a dataset's frames, kept step by step while envs run."""

from __future__ import annotations

import torch


class StateLags:
    """Per env, the last max(lags) + 1 joint readings; each call adds the current one and returns the lagged ones.

    An env's first reading after ``reset`` fills its whole history, so a lag longer than the episode so far gives the
    episode's first frame, as a dataset's frames do.

    Args:
        lags: frames back, each >= 1.
        num_envs: N.
    """

    def __init__(self, lags: list[int], num_envs: int) -> None:
        if not lags or min(lags) < 1:
            raise ValueError(f"state lags must be frames back, each >= 1, got {lags}")
        self.lags = torch.as_tensor(list(lags), dtype=torch.long)
        self.depth = int(self.lags.max()) + 1
        self.history: torch.Tensor | None = None  # [N, depth, D], index 0 the latest reading
        self.fresh = torch.ones(num_envs, dtype=torch.bool)  # the next reading starts the env's episode

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        """The joints ``state`` [N, D] now; returns float32 [N, L, D], the readings ``lags`` steps before (CPU)."""
        state = state.detach().float().cpu()
        if self.history is None:
            self.history = state[:, None].repeat(1, self.depth, 1)
        else:
            self.history = torch.cat([state[:, None], self.history[:, :-1]], dim=1)
            self.history[self.fresh] = state[self.fresh, None]
        self.fresh[:] = False
        return self.history[:, self.lags]

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Envs ``env_ids`` (all: None) start an episode at their next reading."""
        self.fresh[slice(None) if env_ids is None else env_ids.cpu()] = True
