"""``Task``: what a task on a MuJoCo model defines -- observations, reward terms, terminations, resets."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import mujoco
import torch

from robot_rl.env import Obs, ObsSpec
from sim.state import SimState


class Task(ABC):
    """A task on a MuJoCo model: observations, reward terms, terminations, resets. One file per task.

    Reward terms are small batched functions returning [N] tensors, named in ``reward_term_names`` (the order
    ``reward_terms`` returns them in); their weights live in the task config (``cfg.reward_weights``: a name
    that is not a term is an error at env construction, a term left out weighs 0) and each weighted term is
    logged as ``reward/<term>``.
    """

    name: str
    instruction: str  # the language instruction, when every episode has the same one (see ``instructions``)
    reward_term_names: tuple[str, ...]
    cfg: Any
    action_dim: int
    decimation: int  # physics steps per control step
    has_success = True  # False: no success event (a locomotion task); success is then False throughout

    @abstractmethod
    def build_spec(self) -> mujoco.MjSpec:
        """The scene, with the sensors the task reads."""

    @abstractmethod
    def bind(self, model: mujoco.MjModel, num_envs: int, device: torch.device) -> None:
        """Resolve names to indices and allocate per-env buffers."""

    @abstractmethod
    def obs_spec(self) -> ObsSpec: ...

    @abstractmethod
    def reset(self, state: SimState, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        """Write new initial qpos/qvel/ctrl/mocap for ``env_ids`` into ``state``; resample commands/targets."""

    @abstractmethod
    def action_to_ctrl(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        """[N, A] in [-1, 1] -> actuator controls [N, nu] in the model's units."""

    @abstractmethod
    def observations(self, state: SimState) -> Obs:
        """State observation groups (images are added by the env when the task asks for cameras)."""

    @abstractmethod
    def reward_terms(self, state: SimState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted reward terms, each [N], keyed and ordered as ``reward_term_names``."""

    def reward_term_matrix(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        """float [N, terms]: the unweighted terms as columns in ``reward_term_names`` order (what the env weighs and
        sums). By default ``reward_terms`` stacked; a task that computes its terms together (a fused kernel) returns
        its matrix as it is.

        Raises:
            RuntimeError: ``reward_terms`` returned other names, or another order, than ``reward_term_names``.
        """
        terms = self.reward_terms(state, action)
        if tuple(terms) != tuple(self.reward_term_names):
            raise RuntimeError(f"{type(self).__name__}.reward_terms returned {list(terms)}, but its "
                               f"reward_term_names are {list(self.reward_term_names)} (same order)")
        return torch.stack(list(terms.values()), dim=1)

    @abstractmethod
    def success(self, state: SimState) -> torch.Tensor:
        """bool [N]."""

    def terminated(self, state: SimState) -> torch.Tensor:
        """bool [N]: true ends other than success (a fall, an object off the table)."""
        return torch.zeros(state.num_envs, dtype=torch.bool, device=state.qpos.device)

    def instructions(self, num_envs: int) -> list[str]:
        """[N] the instruction of each env's current episode. A task whose text changes per episode (a colour
        drawn at reset) overrides this; the env asks again only after a reset, and only when someone reads it."""
        return [self.instruction] * num_envs

    def cameras(self) -> list[str]:
        """Cameras whose images are observations (empty: state-only)."""
        return []

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        """Per-env task buffers (targets, commands, previous actions) for checkpoints."""
        return {}

    def load_task_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for k, v in sd.items():
            getattr(self, k).copy_(v)


def reward_weight_vector(task: Task, device: torch.device) -> torch.Tensor:
    """float [terms] weights in ``task.reward_term_names`` order from ``task.cfg.reward_weights``.

    Raises:
        ValueError: naming any weight that is not one of the task's reward terms (a typo would otherwise weigh 0).
    """
    weights, names = dict(task.cfg.reward_weights), tuple(task.reward_term_names)
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"task {task.name!r}: unknown reward weight(s) {unknown} in reward_weights; "
                         f"its reward terms are {list(names)}")
    return torch.tensor([float(weights[k]) if k in weights else 0.0 for k in names], device=device)
