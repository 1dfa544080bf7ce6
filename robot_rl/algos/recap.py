"""RECAP (π*0.6's advantage-conditioned policy extraction) on logged LeRobot frames.

1. **Value** (``robot_rl.algos.value_learning``): a distributional value model is fitted to every logged frame's
   value target.
2. **Labels** (``robot_rl.algos.advantages``): its predictions give N-step advantages and the indicator
   I_t = 1[A_t ≥ the task's (1 − positive_fraction) quantile], written to a sidecar in the run folder.
3. **Extraction** (here). The flow VLA is trained by plain behaviour cloning (``robot_rl.algos.bc.BC``) on batches
   that carry the indicator as its conditioning input (``policies.flow_vla.CONDITION_KEY``; the policy drops it with
   probability ``cond_dropout`` so it also learns the unconditional velocity) and samples with classifier-free
   guidance v = v_u + β (v_c − v_u), β = ``guidance_beta`` saved in its config: the exported policy needs no value
   model at run time.

AWR (``robot_rl.algos.awr``) shares steps 1-2 and oversamples high-advantage frames instead of conditioning.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from policies.flow_vla import CONDITION_KEY
from robot_rl.data.labels import Labels


@dataclass
class RecapConfig:
    """How RECAP's extraction draws its frames (``algo.recap.*``)."""

    # Share of each batch drawn from frames with a positive indicator; None: as they come (π*0.6's recipe). With
    # few good frames in the data, the conditional velocity v_c sees them rarely at a fixed number of gradient steps
    # (benchmarks/recap.py: the expert's frames were 10 % of the mixed so101_lift data); 0.5 shows v_c and v_u
    # (the negatives and the dropped indicators) equally often. The indicator is still the input: the negatives
    # are learned as such, not thrown away as AWR's sampler nearly does.
    positive_share: float | None = None

    def __post_init__(self) -> None:
        if self.positive_share is not None and not 0.0 < self.positive_share < 1.0:
            raise ValueError(f"recap positive_share must be in (0, 1) or null, got {self.positive_share}")


def indicator_weights(indicator: np.ndarray, positive_share: float) -> torch.Tensor:
    """Per-frame sampling weights [F] float64 under which a draw is a positive frame with probability
    ``positive_share`` (uniform within the positives and within the negatives). Where every frame has the same
    indicator the weights are uniform.

    Example: indicator [1, 0, 0, 0], share 0.5 -> [0.5, 1/6, 1/6, 1/6].
    """
    pos = np.asarray(indicator).reshape(-1).astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return torch.full((len(pos),), 1.0 / max(len(pos), 1), dtype=torch.float64)
    w = np.where(pos, positive_share / n_pos, (1.0 - positive_share) / n_neg)
    return torch.from_numpy(w.astype(np.float64))


class ConditionedSampler:
    """A ``ChunkSampler`` whose batches also carry the advantage indicator (``CONDITION_KEY``, float [B]) of each
    frame; everything else (order, state, resuming) is the wrapped sampler's. Its fingerprint covers the labels, so a
    resumed run refuses other labels."""

    def __init__(self, sampler: Any, indicator: np.ndarray) -> None:
        self.sampler = sampler
        ind = torch.as_tensor(np.asarray(indicator), dtype=torch.float32).reshape(-1)
        if len(ind) != sampler.num_frames:
            raise ValueError(f"{len(ind)} indicators for {sampler.num_frames} frames")
        index = sampler.indices["index"]
        self._row_of = torch.full((int(index.max()) + 1,), -1, dtype=torch.long)
        self._row_of[index] = torch.arange(len(index))
        self.indicator = ind
        h = hashlib.sha256(sampler.fingerprint().encode())
        h.update(ind.numpy().tobytes())
        self._fingerprint = h.hexdigest()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

    def fingerprint(self) -> str:
        return self._fingerprint

    def _add(self, batch: dict[str, Any]) -> dict[str, Any]:
        batch[CONDITION_KEY] = self.indicator[self._row_of[batch["index"]]]
        return batch

    def sample(self) -> dict[str, Any]:
        return self._add(self.sampler.sample())

    def batch(self, idx: torch.Tensor) -> dict[str, Any]:
        return self._add(self.sampler.batch(idx))

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.sampler.load_state_dict(sd)


def recap_policy_overrides(policy_raw: dict[str, Any]) -> dict[str, Any]:
    """The policy section with conditioning on (RECAP trains the conditional and unconditional velocities).

    Raises:
        ValueError: ``guidance_beta`` < 1 (RECAP samples toward the positive indicator).
    """
    beta = float(policy_raw.get("guidance_beta", 1.0))
    if beta < 1.0:
        raise ValueError(f"bad config: algo.policy.guidance_beta={beta}: RECAP samples with β >= 1")
    return {**policy_raw, "conditioning": True}


def recap_sampler(sampler: Any, labels: Labels, cfg: RecapConfig) -> ConditionedSampler:
    """The sampler RECAP's extraction trains on: ``sampler``'s batches with each frame's indicator, positives drawn at
    ``cfg.positive_share`` when it is set (``sampler.set_weights``), as they come otherwise."""
    if cfg.positive_share is not None:
        sampler.set_weights(indicator_weights(labels.advantage_indicator, cfg.positive_share))
    return ConditionedSampler(sampler, labels.advantage_indicator)
