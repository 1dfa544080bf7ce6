"""``SimState``: the batched view of N simulations that tasks read and write (torch tensors [N, ...])."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mujoco
import torch


class SimState:
    """Batched view of N simulations for tasks: torch tensors [N, ...] plus name lookups.

    ``sensordata`` rows are computed inside the last physics substep (before its integration), the same
    convention as gymnasium's MuJoCo envs and MJX; ``qpos``/``qvel`` are the state after it.

    ``derived`` memoises quantities a task computes from the sensor readings (the base's frame velocities, contacts,
    a fall test), which its reward terms, success, termination and observations would otherwise each recompute
    after every physics step. A backend calls ``invalidate`` whenever it publishes new readings (``step``,
    ``forward``, ``load_state_dict``), so a memoised value is exactly as fresh as ``sensordata``. Code that writes
    into ``sensordata`` itself (a test constructing a reading) calls ``invalidate`` after, if it read before.
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
        self._derived: dict[str, Any] = {}

    def invalidate(self) -> None:
        """Forget every ``derived`` value: the backend has published new sensor readings."""
        self._derived.clear()

    def derived(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, memoised under ``key`` until the next ``invalidate``. Only for values computed from
        ``sensordata`` (which changes only when the backend publishes); callers must not modify what it returns."""
        value = self._derived.get(key)
        if value is None:
            value = self._derived[key] = compute()
        return value

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
