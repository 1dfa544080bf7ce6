"""Rendering many (env, camera) images per GL pass: tiles of one offscreen buffer, one read-back per pass.

On a CPU renderer (Mesa llvmpipe) each ``mujoco.Renderer.render`` call pays a fixed cost (the multisample resolve
and the pixel read-back) larger than drawing our scenes: a 64x64 image cost 7.8 ms alone and 4.0 ms as one of 16
tiles of a pass (so101_lift, front and wrist, 2026-12-02). ``TiledRenderer`` draws each image into its own
viewport of the model's offscreen buffer (``visual/global offwidth x offheight``) and reads the pass back once.

Each (env, camera) pair has a fixed tile, whatever else is rendered with it, so an image does not depend on the
batch it was rendered in (a rasterizer's sub-pixel rounding depends on the viewport's position: the same scene
drawn in another tile can differ in a few edge pixels by a few levels). The image in tile 0 is the one a
``mujoco.Renderer`` of the image's size draws.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import mujoco
import numpy as np
import torch

# Shadows, reflections and the skybox cost ~70 ms a frame on a CPU renderer (DESIGN.md §4).
OFF_FLAGS = (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX)

# env i -> (its model, its data with the state loaded and mj_forward done)
LoadEnv = Callable[[int], tuple[mujoco.MjModel, mujoco.MjData]]


class TiledRenderer:
    """uint8 images [n, H, W, 3] of (env, camera) pairs, rendered in tiles of the offscreen buffer.

    Args:
        model: the model whose assets (meshes, textures) the GL context holds; per-env models passed to ``render``
            must share them (randomized copies of it).
        max_tiles: tiles a buffer needs at most (num_envs x the model's cameras); fewer than the offscreen buffer
            holds make a smaller buffer, cheaper to draw into when there are few envs (one arm's two cameras).
    """

    def __init__(self, model: mujoco.MjModel, max_tiles: int | None = None) -> None:
        self.model = model
        self.max_tiles = max_tiles
        self._renderers: dict[tuple[int, int], tuple[mujoco.Renderer, int, int]] = {}  # (w, h) -> (r, cols, rows)
        self._option = mujoco.MjvOption()
        self._cams: dict[str, mujoco.MjvCamera] = {}

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) of ``width`` x ``height`` tiles in the offscreen buffer."""
        off = self.model.vis.global_
        cols, rows = off.offwidth // width, off.offheight // height
        if cols < 1 or rows < 1:
            raise ValueError(f"images of {width}x{height} px do not fit the model's offscreen buffer "
                             f"({off.offwidth}x{off.offheight}): raise <visual><global offwidth=... offheight=...> in "
                             "its MJCF")
        if self.max_tiles is not None and self.max_tiles < cols * rows:
            cols = min(cols, self.max_tiles)
            rows = -(-self.max_tiles // cols)
        return cols, rows

    def render(self, load: LoadEnv, env_ids: Sequence[int], cameras: Sequence[str], width: int,
               height: int) -> dict[str, np.ndarray]:
        """{camera: uint8 [len(env_ids), height, width, 3]}: each env loaded once, every camera drawn from it (no
        camera: nothing loaded, {})."""
        if not cameras:
            return {}
        r, cols, rows = self._renderer(width, height)
        slots = cols * rows
        ncam = self.model.ncam
        cam_ids = {c: self._camera_id(c) for c in cameras}
        out = {c: np.empty((len(env_ids), height, width, 3), dtype=np.uint8) for c in cameras}
        pending: dict[int, tuple[str, int]] = {}  # tile -> (camera, row of the output) drawn, not yet read back
        # mujoco.Renderer's own GL and MjrContext (private attributes, checked with mujoco 4.0): the same buffer and
        # settings as its render(), so tile 0 is its image bit for bit
        ctx = r._mjr_context
        r._gl_context.make_current()
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, ctx)
        for j, i in enumerate(env_ids):
            model, data = load(int(i))
            for cam in cameras:
                tile = (int(i) * ncam + cam_ids[cam]) % slots
                if tile in pending:  # the tile holds an image not read yet: read this pass back first
                    self._read(r, pending, cols, width, height, out)
                mujoco.mjv_updateScene(model, data, self._option, None, self._cams[cam],
                                       mujoco.mjtCatBit.mjCAT_ALL.value, r.scene)
                mujoco.mjr_render(self._rect(tile, cols, width, height), r.scene, ctx)
                pending[tile] = (cam, j)
        if pending:
            self._read(r, pending, cols, width, height, out)
        return out

    def render_chw(self, load: LoadEnv, env_ids: Sequence[int], cameras: Sequence[str], width: int,
                   height: int) -> dict[str, torch.Tensor]:
        """``render`` as {camera: uint8 tensor [len(env_ids), 3, height, width]} (the backends' image layout)."""
        frames = self.render(load, env_ids, cameras, width, height)
        return {c: torch.from_numpy(f).permute(0, 3, 1, 2).contiguous() for c, f in frames.items()}

    def close(self) -> None:
        for r, _, _ in self._renderers.values():
            r.close()
        self._renderers.clear()

    # ------------------------------------------------------------------------------------------- internals
    @staticmethod
    def _rect(tile: int, cols: int, width: int, height: int) -> mujoco.MjrRect:
        return mujoco.MjrRect((tile % cols) * width, (tile // cols) * height, width, height)

    def _read(self, r: mujoco.Renderer, pending: dict[int, tuple[str, int]], cols: int, width: int, height: int,
              out: dict[str, np.ndarray]) -> None:
        """Read back the rows of tiles holding ``pending`` images (one read), copy each image out, clear it."""
        top = max(pending) // cols + 1  # tile rows 0 .. top - 1, counted from the bottom (GL's origin)
        used = min(cols, max(pending) + 1) if top == 1 else cols
        buf = np.empty((top * height, used * width, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(buf, None, mujoco.MjrRect(0, 0, used * width, top * height), r._mjr_context)
        for tile, (cam, j) in pending.items():
            y, x = (tile // cols) * height, (tile % cols) * width
            out[cam][j] = buf[y:y + height, x:x + width][::-1]  # GL rows run bottom-up
        pending.clear()

    def _renderer(self, width: int, height: int) -> tuple[mujoco.Renderer, int, int]:
        key = (width, height)
        if key not in self._renderers:
            cols, rows = self.grid(width, height)
            os.environ.setdefault("MUJOCO_GL", "egl")
            r = mujoco.Renderer(self.model, height=rows * height, width=cols * width)
            for flag in OFF_FLAGS:
                r.scene.flags[flag] = 0
            self._renderers[key] = (r, cols, rows)
        return self._renderers[key]

    def _camera_id(self, name: str) -> int:
        cid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, name)
        if cid < 0:
            names = [self.model.camera(k).name for k in range(self.model.ncam)]
            raise ValueError(f"no camera named {name!r}; the model has {names}")
        if name not in self._cams:
            cam = mujoco.MjvCamera()
            cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
            cam.fixedcamid = cid
            self._cams[name] = cam
        return cid
