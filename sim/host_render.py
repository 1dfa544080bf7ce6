"""Rendering the envs of a batched device backend (mjx, warp) on MuJoCo's CPU renderer.

Env ``i``'s state, and its randomized parameters when there are any, are copied into a native MjData and a private
MjModel, ``mj_forward`` places the bodies, and the scene is drawn from that model (so randomized cameras and lights
show) into its tile of ``sim.tiled_render``'s buffer. A device-side renderer would avoid the copies; images are rare
in our tasks.
"""

from __future__ import annotations

import copy

import mujoco
import torch

from sim.randomization import BatchedModelParams, write_env_params
from sim.state import SimState
from sim.tiled_render import TiledRenderer


class HostRenderer:
    """uint8 [len(env_ids), 3, H, W] frames of a batched ``SimState``."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, params: BatchedModelParams | None = None) -> None:
        self.params = params
        self.model = copy.copy(model) if params is not None else model  # written per env when randomized
        self._data = mujoco.MjData(model)
        self._tiles = TiledRenderer(self.model, num_envs * max(1, model.ncam))

    def load_env(self, state: SimState, i: int) -> mujoco.MjData:
        """Env ``i`` of ``state`` (and its parameters) copied into the native MjData/MjModel, forwarded."""
        d, m = self._data, self.model
        if self.params is not None:
            write_env_params(m, self.params.tensors, i)
        for k in ("qpos", "qvel", "ctrl"):
            getattr(d, k)[:] = getattr(state, k)[i].cpu().double().numpy()
        if m.nmocap:
            d.mocap_pos[:] = state.mocap_pos[i].cpu().double().numpy()
            d.mocap_quat[:] = state.mocap_quat[i].cpu().double().numpy()
        mujoco.mj_forward(m, d)
        return d

    def render_many(self, state: SimState, cameras: list[str], width: int, height: int,
                    env_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        ids = range(state.num_envs) if env_ids is None else env_ids.tolist()
        return self._tiles.render_chw(lambda i: (self.model, self.load_env(state, i)), ids, cameras, width, height)

    def close(self) -> None:
        self._tiles.close()
