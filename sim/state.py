"""``SimState``: the batched view of N simulations that tasks read and write (torch tensors [N, ...])."""

from __future__ import annotations

import mujoco
import torch


class SimState:
    """Batched view of N simulations for tasks: torch tensors [N, ...] plus name lookups.

    ``sensordata`` rows are computed inside the last physics substep (before its integration), the same
    convention as gymnasium's MuJoCo envs and MJX; ``qpos``/``qvel`` are the state after it.
    """

    def __init__(self, model: mujoco.MjModel, qpos: torch.Tensor, qvel: torch.Tensor, ctrl: torch.Tensor,
                 mocap_pos: torch.Tensor, mocap_quat: torch.Tensor, sensordata: torch.Tensor) -> None:
        self.model = model
        self.qpos, self.qvel, self.ctrl = qpos, qvel, ctrl
        self.mocap_pos, self.mocap_quat = mocap_pos, mocap_quat  # [N, nmocap, 3], [N, nmocap, 4]
        self._sensor_slices = {}
        for i in range(model.nsensor):
            adr, dim = int(model.sensor_adr[i]), int(model.sensor_dim[i])
            self._sensor_slices[model.sensor(i).name] = slice(adr, adr + dim)
        self.sensordata = sensordata

    @property
    def sensordata(self) -> torch.Tensor:
        """[N, nsensordata] all sensor readings."""
        return self._sensordata

    @sensordata.setter
    def sensordata(self, value: torch.Tensor) -> None:
        # A backend that publishes new tensors each step (mjx) replaces it; the views of the old one go with it.
        self._sensordata = value
        self._sensor_views: dict[str, torch.Tensor] = {}

    @property
    def num_envs(self) -> int:
        return self.qpos.shape[0]

    def sensor(self, name: str) -> torch.Tensor:
        """[N, dim] readings of a named sensor: a view of ``sensordata``, made once per tensor (tasks read a
        dozen sensors every step, and slicing costs more than the arithmetic on them)."""
        view = self._sensor_views.get(name)
        if view is None:
            if name not in self._sensor_slices:
                raise KeyError(f"no sensor named {name!r}; the model has {sorted(self._sensor_slices)}")
            view = self._sensor_views[name] = self._sensordata[:, self._sensor_slices[name]]
        return view
