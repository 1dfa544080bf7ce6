"""Tiled rendering: the images of a pass are the images one mujoco.Renderer call per image draws, each (env, camera)
has a fixed tile (an image does not depend on its batch), passes that overflow the buffer, and clear errors."""

import mujoco
import numpy as np
import pytest
import torch

from sim.config import SimConfig
from sim.registry import make_env, task_config
from sim.tiled_render import OFF_FLAGS, TiledRenderer

CAMS = ["front", "wrist"]


def _env(n: int, size: int = 64):
    cfg = task_config("so101_lift", {"cameras": CAMS, "image_width": size, "image_height": size})
    env = make_env("so101_lift", SimConfig(num_envs=n, num_threads=1, seed=0), cfg)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):  # arms in different poses
        env.step(torch.rand(n, env.action_dim, generator=gen) * 2 - 1)
    return env


def _one_call_each(env, cam: str, size: int) -> np.ndarray:
    """The reference: one mujoco.Renderer.render per image, at the image's size (the earlier renderer)."""
    ref = mujoco.Renderer(env.physics.model, size, size)
    for flag in OFF_FLAGS:
        ref.scene.flags[flag] = 0
    out = []
    for i in range(env.num_envs):
        ref.update_scene(env.physics._load_env(i)[1], camera=cam)
        out.append(ref.render().copy())
    ref.close()
    return np.stack(out)


def test_tiles_draw_what_one_render_call_per_image_draws():
    env = _env(6)
    frames = env.physics.render_many(CAMS, 64, 64)
    for cam in CAMS:
        ref = _one_call_each(env, cam, 64)
        new = frames[cam].permute(0, 2, 3, 1).numpy()
        assert new.shape == ref.shape == (6, 64, 64, 3)
        diff = np.abs(new.astype(int) - ref.astype(int))
        # tile 0 (env 0's first camera) is drawn where a 64x64 renderer draws: bit for bit
        if cam == "front":
            assert np.array_equal(new[0], ref[0])
        # elsewhere the rasterizer's sub-pixel rounding moves an edge pixel here and there
        assert diff.mean() < 0.05, (cam, diff.mean())
        assert (diff.max(axis=-1) > 0).mean() < 0.01, cam
        assert len({new[i].tobytes() for i in range(6)}) == 6  # every env its own image
    env.close()


def test_an_image_does_not_depend_on_what_is_rendered_with_it():
    env = _env(5)
    full = env.physics.render_many(CAMS, 64, 64)
    for ids in ([3], [4, 1], [2, 0, 3]):
        part = env.physics.render_many(CAMS, 64, 64, torch.tensor(ids))
        for cam in CAMS:
            assert torch.equal(part[cam], full[cam][ids]), (ids, cam)
    assert torch.equal(env.physics.render("wrist", 64, 64, torch.tensor([2]))[0], full["wrist"][2])
    env.close()


def test_more_images_than_tiles_take_several_passes():
    env = _env(10, size=128)  # 640x480 buffer: 5 x 3 = 15 tiles of 128x128 for 20 images
    assert TiledRenderer(env.physics.model).grid(128, 128) == (5, 3)
    full = env.physics.render_many(CAMS, 128, 128)
    for i in range(10):
        alone = env.physics.render_many(CAMS, 128, 128, torch.tensor([i]))
        for cam in CAMS:
            assert torch.equal(alone[cam][0], full[cam][i]), (i, cam)
    env.close()


def test_clear_errors():
    env = _env(1)
    with pytest.raises(ValueError, match="offwidth"):
        env.physics.render("front", 1000, 64)
    with pytest.raises(ValueError, match="no camera named 'top'"):
        env.physics.render("top", 64, 64)
    env.close()


def test_no_camera_loads_no_env_and_chw_layout_matches():
    env = _env(3)
    tiles, loaded = env.physics._tiles, []

    def load(i):
        loaded.append(i)
        return env.physics._load_env(i)

    assert tiles.render(load, range(3), [], 64, 64) == {} and loaded == []
    hwc = tiles.render(load, range(3), CAMS, 64, 64)
    chw = tiles.render_chw(load, range(3), CAMS, 64, 64)
    for cam in CAMS:
        assert chw[cam].shape == (3, 3, 64, 64) and chw[cam].dtype == torch.uint8
        assert torch.equal(chw[cam], torch.from_numpy(hwc[cam]).permute(0, 3, 1, 2))
    env.close()
