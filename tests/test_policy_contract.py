"""The policy contract: nested configs round-trip, processors travel with the weights, chunked policies run through
the same evaluation as step policies, and malformed chunks or observations are refused before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from policies import ActionQueue, GaussianPolicy, GaussianPolicyConfig, Policy, config_from_dict, load_policy
from policies.processor import Features, Processor
from robot_rl.evaluation import evaluate
from tests._toy_envs import PointMassEnv


@dataclass
class _Inner:
    width: int = 8
    names: list[str] = field(default_factory=lambda: ["a"])


@dataclass
class _Outer:
    action_dim: int
    inner: _Inner = field(default_factory=_Inner)
    maybe: _Inner | None = None


def test_nested_configs_round_trip():
    from dataclasses import asdict

    cfg = _Outer(action_dim=2, inner=_Inner(4, ["x", "y"]), maybe=_Inner(3))
    back = config_from_dict(_Outer, asdict(cfg))
    assert back == cfg and isinstance(back.inner, _Inner) and isinstance(back.maybe, _Inner)
    with pytest.raises(TypeError, match=r"inner: unknown keys \['wdth'\]"):
        config_from_dict(_Outer, {"action_dim": 1, "inner": {"wdth": 3}})



def test_feature_names_must_fit_their_flat_group():
    Features(inputs={"policy": [3]}, action_dim=2, names={"policy": ["x", "y", "z"]})
    for names, inputs in (({"policy": ["x", "y"]}, {"policy": [3]}),  # too few names
                          ({"image": ["r", "g", "b"]}, {"image": [3, 8, 8]})):  # an image is not a flat group
        with pytest.raises(ValueError, match="names for input"):
            Features(inputs=inputs, action_dim=2, names=names)
    with pytest.raises(ValueError, match="not an input"):
        Features(inputs={"policy": [3]}, action_dim=2, names={"proprio": ["x"]})
    with pytest.raises(ValueError, match="1 action names for action_dim 2"):
        Features(inputs={"policy": [3]}, action_dim=2, action_names=["gripper"])

def test_processor_travels_with_the_policy(tmp_path):
    features = Features(inputs={"policy": [3]}, action_dim=2, names={"policy": ["x", "y", "z"]},
                        action_names=["shoulder_pan", "gripper"])
    cfg = GaussianPolicyConfig(obs_dim=3, action_dim=2)
    pol = GaussianPolicy(cfg, Processor(features, ["policy"]))
    pol.update_normalizer({"policy": torch.randn(64, 3) * 5 + 2})
    pol.save(tmp_path / "p")
    assert {p.name for p in (tmp_path / "p").iterdir()} == {"config.json", "model.safetensors", "processor.json",
                                                          "processor.safetensors"}
    back = load_policy(tmp_path / "p")
    assert back.processor.features == features
    stats = back.processor.normalizers["policy"]
    assert torch.equal(stats.mean, pol.processor.normalizers["policy"].mean) and float(stats.count) == 64
    obs = {"policy": torch.randn(5, 3)}
    pol.eval()
    assert torch.equal(back.act(obs), pol.act(obs))
    with pytest.raises(ValueError, match="'policy' has shape \\[4\\] per env, the policy was trained on \\[3\\]"):
        back.processor.check({"policy": torch.zeros(1, 4)})
    with pytest.raises(ValueError, match="reads observation group 'policy'"):
        back.processor.check({"proprio": torch.zeros(1, 3)})


class _ChunkPolicy(Policy):
    """Drives the point mass to the origin with chunks [N, H, 1]: each chunk plans H steps from its observation
    and counts how often it was asked."""

    type_name, config_class = "test_chunk", dict

    def __init__(self, horizon: int = 5, executed: int = 3, bad_shape: bool = False) -> None:
        super().__init__()
        self._h, self._e, self.bad_shape = horizon, executed, bad_shape
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.calls, self.rows = 0, 0
        self.resets: list[int] = []

    @property
    def horizon(self) -> int:
        return self._h

    @property
    def executed_steps(self) -> int:
        return self._e

    def act(self, obs, deterministic=True):
        self.calls, self.rows = self.calls + 1, self.rows + len(obs["policy"])
        x = obs["policy"][:, 0]
        steps = torch.arange(self._h, dtype=torch.float32)
        # x_k after k steps of 0.1·a: plan a = −x / 0.1 clipped, shrinking as the plan proceeds
        plan = (-(x[:, None] - 0.1 * steps * torch.sign(-x[:, None])) / 0.1).clamp(-1, 1)
        out = plan[:, :, None] * self.scale
        return out[:, :, 0] if self.bad_shape else out

    def reset(self, env_ids=None):
        self.resets.append(-1 if env_ids is None else len(env_ids))


def test_action_queue_executes_chunks_then_asks_again():
    pol = _ChunkPolicy(horizon=5, executed=3)
    q = ActionQueue(pol, num_envs=4, action_dim=1)
    obs = {"policy": torch.full((4, 1), 0.9)}
    actions = [q(obs) for _ in range(7)]
    assert pol.calls == 3 and pol.rows == 12  # steps 0, 3, 6 ask; the others execute the queued chunk
    assert all(a.shape == (4, 1) for a in actions)
    q.reset(torch.tensor([1]))  # env 1 starts a new episode: only it asks on the next step
    q(obs)
    assert pol.calls == 4 and pol.rows == 13 and pol.resets[-1] == 1


def test_a_chunked_policy_evaluates_like_any_other():
    pol = _ChunkPolicy(horizon=5, executed=2)
    result = evaluate(PointMassEnv(num_envs=8, seed=1), pol, 16, seed=3)
    assert result.num_episodes == 16 and result.success_rate == 1.0, result
    assert pol.calls > 0 and pol.resets  # episodes that ended had their queues reset


def test_malformed_chunks_are_refused_before_execution():
    q = ActionQueue(_ChunkPolicy(bad_shape=True), num_envs=2, action_dim=1)
    with pytest.raises(ValueError, match=r"returned shape \(2, 5\), expected \(2, 5, 1\)"):
        q({"policy": torch.zeros(2, 1)})
    nan = _ChunkPolicy()
    nan.scale.data.fill_(float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        ActionQueue(nan, num_envs=2, action_dim=1)({"policy": torch.ones(2, 1)})
    with pytest.raises(ValueError, match="executed_steps 6 must be in"):
        ActionQueue(_ChunkPolicy(horizon=5, executed=6), num_envs=2, action_dim=1)
