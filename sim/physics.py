"""``Physics``: N simulations of one MuJoCo model behind one interface (mujoco CPU, mjx, warp implement it)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import mujoco
import torch

from robot_rl.env import nonfinite_rows
from sim.randomization import BatchedModelParams
from sim.state import SimState


class Physics(ABC):
    """N simulations of one model. Tensors in ``state`` are updated in place by ``step`` and ``set``."""

    model: mujoco.MjModel
    state: SimState
    num_envs: int

    @abstractmethod
    def step(self, ctrl: torch.Tensor, nsubsteps: int) -> torch.Tensor:
        """Hold ``ctrl`` [N, nu] for ``nsubsteps`` physics steps. Returns bool [N]: envs that diverged."""

    def randomize(self, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        """Draw new per-env model parameters for ``env_ids`` (see ``sim.randomization``)."""
        raise NotImplementedError(f"{type(self).__name__} does not randomize model parameters")

    def nonfinite(self) -> torch.Tensor:
        """bool [N]: envs whose state or sensor readings hold a NaN or inf."""
        s = self.state
        return nonfinite_rows(s.qpos) | nonfinite_rows(s.qvel) | nonfinite_rows(s.sensordata)

    def faults(self, max_abs_qvel: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The env's checks after every step, bool [N] each: ``nonfinite()``, and the envs with a finite joint speed
        above ``max_abs_qvel`` (a diverging simulation; a NaN counts only as non-finite)."""
        return self.nonfinite(), self.state.qvel.abs().amax(dim=1) > max_abs_qvel

    @abstractmethod
    def forward(self, env_ids: torch.Tensor) -> None:
        """Recompute derived quantities (sensordata) of ``env_ids`` after their state was written."""

    @abstractmethod
    def render_many(self, cameras: list[str], width: int, height: int,
                    env_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """{camera: uint8 [len(env_ids), 3, H, W]} frames of several cameras (each env's state loaded once)."""

    def render(self, camera: str, width: int, height: int, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [len(env_ids), 3, H, W] frames of one camera."""
        return self.render_many([camera], width, height, env_ids)[camera]

    def state_dict(self) -> dict[str, torch.Tensor]:
        s = self.state
        return {k: getattr(s, k).clone() for k in ("qpos", "qvel", "ctrl", "mocap_pos", "mocap_quat", "sensordata")}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for k, v in sd.items():
            getattr(self.state, k).copy_(v)
        self.state.invalidate()

    def close(self) -> None:
        pass


class BatchedParamsPhysics(Physics):
    """A device backend (mjx, warp) whose randomized model fields live as [N, ...] tensors in one
    ``BatchedModelParams`` (None: nothing randomized); they are redrawn, saved and restored here."""

    _params: BatchedModelParams | None = None

    def _params_changed(self) -> None:
        """Called after the parameter tensors were rewritten (redrawn or loaded)."""

    def randomize(self, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        if self._params is not None:
            self._params.randomize(env_ids, gen)
            self._params_changed()

    def state_dict(self) -> dict[str, torch.Tensor]:
        sd = super().state_dict()
        if self._params is not None:
            sd.update(self._params.state_dict())
        return sd

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        super().load_state_dict({k: v for k, v in sd.items() if not k.startswith("model.")})
        if self._params is not None:
            self._params.load_state_dict(sd)
            self._params_changed()
