"""The offline loop: sample a batch -> update -> log -> checkpoint, with no env (logged data only)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from robot_rl.algos.base import Algorithm
from robot_rl.checkpoint import Checkpoint, CheckpointManager, rng_state, set_rng_state
from robot_rl.data.sampler import TensorSampler
from robot_rl.logging import RunLogger
from robot_rl.runners.common import RunnerLoop


@dataclass
class OfflineRunnerConfig:
    """How long to train and how often to log and checkpoint."""

    total_updates: int | None = 10_000  # gradient steps; None: only max_minutes
    max_minutes: float | None = None  # wall-clock limit (minutes, summed over resumes)
    updates_per_iteration: int = 100  # gradient steps between log points (the unit of checkpoint_every)
    checkpoint_every: int = 10  # iterations between checkpoints (the last one is always saved)

    def __post_init__(self) -> None:
        if self.total_updates is None and self.max_minutes is None:
            raise ValueError("set total_updates or max_minutes: the run needs a stopping rule")
        if self.updates_per_iteration < 1 or self.checkpoint_every < 1:
            raise ValueError("updates_per_iteration and checkpoint_every must be >= 1")


class OfflineRunner(RunnerLoop):
    """Gradient steps on batches from a sampler; checkpoints hold the learner, the sampler's position and the RNGs,
    and ``meta`` names the data (``dataset``: its fingerprint), so a resumed run refuses other data.

    Args:
        algo: the learner (``update(batch)``).
        sampler: where batches come from (``sample()``, ``state_dict``, ``fingerprint``).
        cfg: the loop's settings.
        logger: progress bar / scalar sinks / learning curve.
        checkpoints: where checkpoints go (None: none are written).
        meta: JSON written into every checkpoint; ``dataset`` is set to the sampler's fingerprint.
    """

    env = None

    def __init__(self, algo: Algorithm, sampler: TensorSampler, cfg: OfflineRunnerConfig, logger: RunLogger,
                 checkpoints: CheckpointManager | None, meta: dict[str, Any]) -> None:
        self.algo, self.sampler, self.cfg, self.logger, self.checkpoints = algo, sampler, cfg, logger, checkpoints
        self.meta = {**meta, "dataset": sampler.fingerprint()}
        self.device, self.obs = algo.device, None
        self.iteration, self.updates, self.elapsed_s = 0, 0, 0.0

    def start(self) -> None:  # logged data: nothing to reset
        pass

    def _done(self) -> bool:
        return ((self.cfg.total_updates is not None and self.updates >= self.cfg.total_updates)
                or (self.cfg.max_minutes is not None and self.elapsed_s >= 60.0 * self.cfg.max_minutes))

    def run_iteration(self) -> dict[str, float]:
        start = time.perf_counter()
        self.algo.train_mode()
        n = self.cfg.updates_per_iteration
        if self.cfg.total_updates is not None:
            n = min(n, self.cfg.total_updates - self.updates)
        sums: dict[str, float] = {}
        for _ in range(n):
            for k, v in self.algo.update(self.sampler.sample()).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        self.updates += n
        self.iteration += 1
        self.elapsed_s += time.perf_counter() - start
        scalars = {k: v / max(n, 1) for k, v in sums.items()}
        scalars.update({"perf/updates": float(self.updates), "data/epoch": float(self.sampler.epoch)})
        self.logger.scalars(self.updates, scalars)
        self.logger.progress(n, None, None)
        self.logger.curve_point({"iteration": self.iteration, "updates": self.updates, "wall_s": self.elapsed_s,
                                 **{k: v for k, v in scalars.items() if k.startswith("loss")}})
        return scalars

    def save(self) -> None:
        assert self.checkpoints is not None
        state = {"algo": self.algo.state_dict(), "sampler": self.sampler.state_dict(), "rng": rng_state(),
                 "runner": {"iteration": self.iteration, "updates": self.updates, "elapsed_s": self.elapsed_s}}
        self.checkpoints.save(self.iteration, state, {**self.meta, "updates": self.updates}, policy=self.algo.export_policy)

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from a checkpoint: learner, sampler position, RNGs and counters as they were."""
        state = ckpt.state
        self.algo.load_state_dict(state["algo"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        r = state["runner"]
        self.iteration, self.updates, self.elapsed_s = int(r["iteration"]), int(r["updates"]), float(r["elapsed_s"])
