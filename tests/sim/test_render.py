"""Offscreen rendering: non-blank batched uint8 frames; image observations only when a task asks for them."""

import torch

from policies import keys
from sim.config import SimConfig
from sim.registry import make_env, task_config


def test_image_observations_are_batched_uint8_and_not_blank():
    cfg = task_config("so101_lift", {"cameras": ["front", "wrist"], "image_width": 64, "image_height": 48})
    env = make_env("so101_lift", SimConfig(num_envs=2), cfg)
    obs, _ = env.reset(seed=0)
    for cam in ("front", "wrist"):
        img = obs[keys.image_key(cam)]
        assert img.shape == (2, 3, 48, 64) and img.dtype == torch.uint8
        assert env.obs_spec.shapes[keys.image_key(cam)] == (3, 48, 64)
        assert img.float().std() > 10  # a scene, not a flat colour
    # the cube appears in the front camera: red pixels exist
    front = obs[keys.image_key("front")].float()
    red = (front[:, 0] > 120) & (front[:, 1] < 80) & (front[:, 2] < 80)
    assert red.sum() > 0
    obs, *_ = env.step(torch.zeros(2, 6))
    assert obs[keys.image_key("wrist")].shape == (2, 3, 48, 64)


def test_state_tasks_carry_no_images_and_render_on_demand():
    env = make_env("so101_reach", SimConfig(num_envs=2))
    obs, _ = env.reset(seed=0)
    assert not any(k.startswith(keys.IMAGE_PREFIX) for k in obs)
    frames = env.render(camera="front", width=96, height=72)
    assert frames.shape == (2, 3, 72, 96) and frames.dtype == torch.uint8
    assert frames.float().std() > 10
    one = env.render(camera="front", width=96, height=72, env_ids=torch.tensor([1]))
    assert torch.equal(one[0], frames[1])
