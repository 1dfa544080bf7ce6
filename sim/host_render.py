"""Rendering the envs of a batched device backend (mjx, warp) on MuJoCo's CPU renderer, one env at a time.

Env ``i``'s state, and its randomized parameters when there are any, are copied into a native MjData and a private
MjModel, ``mj_forward`` places the bodies, and ``mujoco.Renderer`` draws the scene from that model (so randomized
cameras and lights show). A device-side renderer would avoid the copies; images are rare in our tasks.
"""

from __future__ import annotations

import copy
import os

import mujoco
import numpy as np
import torch

from sim.randomization import BatchedModelParams, write_env_params
from sim.state import SimState


class HostRenderer:
    """uint8 [len(env_ids), 3, H, W] frames of a batched ``SimState``."""

    def __init__(self, model: mujoco.MjModel, params: BatchedModelParams | None = None) -> None:
        self.params = params
        self.model = copy.copy(model) if params is not None else model  # written per env when randomized
        self._data = mujoco.MjData(model)
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}

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

    def render(self, state: SimState, camera: str, width: int, height: int,
               env_ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = range(state.num_envs) if env_ids is None else env_ids.tolist()
        r = self._renderer(width, height)
        frames = np.empty((len(ids), height, width, 3), dtype=np.uint8)
        for j, i in enumerate(ids):
            r.update_scene(self.load_env(state, i), camera=camera)
            frames[j] = r.render()
        return torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()

    def _renderer(self, width: int, height: int) -> mujoco.Renderer:
        if (width, height) not in self._renderers:
            os.environ.setdefault("MUJOCO_GL", "egl")
            r = mujoco.Renderer(self.model, height=height, width=width)
            # Shadows, reflections and the skybox cost ~70 ms a frame on a CPU renderer (DESIGN.md §4).
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                         mujoco.mjtRndFlag.mjRND_SKYBOX):
                r.scene.flags[flag] = 0
            self._renderers[(width, height)] = r
        return self._renderers[(width, height)]

    def close(self) -> None:
        for r in self._renderers.values():
            r.close()
        self._renderers.clear()
