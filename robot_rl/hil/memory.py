"""The memory of states worth going back to (DESIGN.md §5, the intervention agent's recovery): every stored state
has a key (what nearness is measured in: the value model's features of the frame, which see the cameras, the
joints and the instruction), a goal (what a recovery drives to: the joints, in the frame's units) and its value.
``retrieve`` answers, for each query, the highest-valued of the ``k`` stored states nearest to it: the good state
closest to where the episode is now.

    memory = StateMemory(features, joints, values, k=8)       # e.g. the frames of past interventions
    goals, values, rows = memory.retrieve(features_now)       # [B, 6], [B], [B]
"""

from __future__ import annotations

import torch


class StateMemory:
    """M stored states (see the module docstring). Keys are compared after each feature is scaled to unit standard
    deviation over the memory, so no feature dominates by its units.

    Args:
        features: float [M, F], the keys.
        goals: float [M, G], what a recovery drives to.
        values: float [M], V of each state (higher is better).
        k: neighbours a query's answer is chosen among (>= 1; fewer when M < k).
    """

    def __init__(self, features: torch.Tensor, goals: torch.Tensor, values: torch.Tensor, k: int = 8) -> None:
        features, goals, values = features.detach().float().cpu(), goals.detach().float().cpu(), values.detach().float().cpu()
        if features.dim() != 2 or goals.dim() != 2 or values.dim() != 1:
            raise ValueError(f"features [M, F], goals [M, G] and values [M] expected, got {list(features.shape)}, "
                             f"{list(goals.shape)}, {list(values.shape)}")
        m = features.shape[0]
        if m < 1 or goals.shape[0] != m or values.shape[0] != m:
            raise ValueError(f"a memory needs >= 1 state and one goal and value per state, got {m} keys, "
                             f"{goals.shape[0]} goals, {values.shape[0]} values")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        for name, t in (("features", features), ("goals", goals), ("values", values)):
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"memory {name} hold NaN or inf")
        self.k = int(k)
        self.mean = features.mean(0)
        self.scale = features.std(0, unbiased=False).clamp_min(1e-6)
        self.keys = (features - self.mean) / self.scale
        self.goals, self.values = goals, values

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def retrieve(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries float [B, F] -> (goals [B, G], values [B], rows [B]) of the best-valued state among each query's k
        nearest (Euclidean in scaled features; a tie in value goes to the nearer)."""
        query = query.detach().float().cpu()
        if query.dim() != 2 or query.shape[1] != self.keys.shape[1]:
            raise ValueError(f"queries must be [B, {self.keys.shape[1]}], got {list(query.shape)}")
        dist = torch.cdist((query - self.mean) / self.scale, self.keys)  # [B, M]
        near = dist.topk(min(self.k, len(self)), dim=1, largest=False).indices  # nearest first
        best = self.values[near].argmax(dim=1, keepdim=True)  # the first maximum: the nearest of equals
        rows = near.gather(1, best).squeeze(1)
        return self.goals[rows], self.values[rows], rows
