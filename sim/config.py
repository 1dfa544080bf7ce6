"""``SimConfig``: which simulator backend runs a task, how many envs, and how they behave at the contract's edges."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.randomization import RandomizationConfig


@dataclass
class SimConfig:
    """The simulator: which backend, how many envs, how they run."""

    backend: str = "mujoco"  # one of sim.registry.BACKENDS
    num_envs: int = 64  # N, envs stepped together
    num_threads: int = 2  # CPU threads stepping physics (mujoco backend)
    device: str = "cpu"  # torch device of the tensors crossing the VecEnv boundary
    seed: int = 0  # seeds task randomization; the same seed gives the same trajectories
    on_nonfinite_action: str = "raise"  # "raise" (a clear error) or "reset" (terminate and reset those envs)
    max_abs_qvel: float = 1e3  # rad/s or m/s; beyond this a simulation counts as diverged and is reset
    # True: envs that end are reset inside step. False: they wait for reset(env_ids=...) like a real arm, and
    # stepping one before that is an error.
    autoreset: bool = True
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)  # domain randomization

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"sim.num_envs must be >= 1, got {self.num_envs}")
        if self.num_threads < 1:
            raise ValueError(f"sim.num_threads must be >= 1, got {self.num_threads}")
        if self.on_nonfinite_action not in ("raise", "reset"):
            raise ValueError(f"sim.on_nonfinite_action must be 'raise' or 'reset', got {self.on_nonfinite_action!r}")
