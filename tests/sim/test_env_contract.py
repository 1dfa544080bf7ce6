"""The VecEnv contract on every SO-101 task with the embedded MuJoCo backend (real MuJoCo, small N)."""

import re

import pytest
import torch

from policies import keys
from sim.config import SimConfig
from sim.registry import make_env, task_config, task_names

TASKS = ["so101_reach", "so101_lift", "so101_push"]


def _env(task, n=4, seed=0, **task_overrides):
    return make_env(task, SimConfig(num_envs=n, num_threads=2, seed=seed), task_config(task, task_overrides))


def _rand_actions(steps, n, a, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(n, a, generator=g) * 2 - 1 for _ in range(steps)]


def test_registry_lists_the_tasks():
    assert set(TASKS) <= set(task_names())


@pytest.mark.parametrize("task", TASKS)
def test_reset_step_shapes_and_finite(task):
    env = _env(task)
    obs, info = env.reset(seed=1)
    for group, shape in env.obs_spec.shapes.items():
        assert obs[group].shape == (4, *shape)
        assert obs[group].dtype == env.obs_spec.dtype(group)
    assert len(env.instructions) == 4 and all(isinstance(s, str) and s for s in env.instructions)
    for a in _rand_actions(30, 4, env.action_dim, 0):
        obs, reward, terminated, truncated, info = env.step(a)
        assert reward.shape == (4,) and terminated.shape == (4,) and truncated.shape == (4,)
        assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
        assert not (terminated & truncated).any()
        assert torch.isfinite(reward).all()
        assert all(torch.isfinite(v).all() for v in obs.values())
        assert all(k.startswith(("reward/", "sim/")) for k in info[keys.LOG])
    env.close()


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_trajectory(task):
    actions = _rand_actions(40, 3, 6, 7)
    runs = []
    for _ in range(2):
        env = _env(task, n=3)
        obs, _ = env.reset(seed=123)
        traj = [obs[keys.POLICY].clone()]
        for a in actions:
            obs, r, *_ = env.step(a)
            traj += [obs[keys.POLICY].clone(), r.clone()]
        runs.append(torch.cat([t.flatten() for t in traj]))
        env.close()
    assert torch.equal(runs[0], runs[1])
    env = _env(task, n=3)
    obs, _ = env.reset(seed=124)
    assert not torch.equal(obs[keys.POLICY].flatten(), runs[0][: obs[keys.POLICY].numel()])


def test_auto_reset_keeps_the_true_final_observation():
    env = _env("so101_reach", n=2, episode_length=5)
    obs, _ = env.reset(seed=0)
    zero = torch.zeros(2, 6)
    for t in range(5):
        prev = obs
        obs, _r, terminated, truncated, info = env.step(zero)
    assert truncated.all() and not terminated.any()
    final = info[keys.FINAL_OBS][keys.POLICY]
    target = slice(15, 18)  # target xyz inside the reach observation
    assert torch.equal(final[:, target], prev[keys.POLICY][:, target])  # same episode's target
    assert not torch.equal(obs[keys.POLICY][:, target], final[:, target])  # new episode, new target
    assert torch.equal(info[keys.EPISODE][keys.EP_LENGTH], torch.tensor([5, 5]))
    assert (env.episodes.lengths == 0).all()


def test_nan_state_resets_only_the_injected_envs():
    env = _env("so101_lift", n=6)
    env.reset(seed=0)
    env.physics.state.qvel[2, 0] = float("nan")
    env.physics.state.qpos[4, 7] = float("inf")
    obs, reward, terminated, _truncated, info = env.step(torch.zeros(6, 6))
    assert terminated.tolist() == [False, False, True, False, True, False]
    assert info["faulted"].tolist() == [False, False, True, False, True, False]
    assert env.counters["sim_nan_resets"] == 2
    assert all(torch.isfinite(v).all() for v in obs.values())
    assert all(torch.isfinite(v).all() for v in info[keys.FINAL_OBS].values())
    assert torch.isfinite(reward).all()
    assert torch.isfinite(env.physics.state.qpos).all()  # the two envs were reset
    # training goes on
    obs, reward, terminated, *_ = env.step(torch.zeros(6, 6))
    assert not terminated.any()


def test_diverging_simulation_is_detected_not_silently_reset():
    env = _env("so101_reach", n=3)
    env.reset(seed=0)
    env.physics.state.qvel[1, :] = 1e12  # MuJoCo would auto-reset this env silently; we terminate it
    _, _, terminated, _, _ = env.step(torch.zeros(3, 6))
    assert terminated.tolist() == [False, True, False]
    assert env.counters["sim_nan_resets"] + env.counters["sim_diverged_resets"] == 1


def test_nan_actions_never_reach_mujoco():
    env = _env("so101_reach", n=3)
    env.reset(seed=0)
    ctrl_before = env.physics.state.ctrl.clone()
    bad = torch.zeros(3, 6)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite action .*envs \[1\]"):
        env.step(bad)
    assert torch.equal(env.physics.state.ctrl, ctrl_before)

    env = make_env("so101_reach", SimConfig(num_envs=3, on_nonfinite_action="reset"))
    env.reset(seed=0)
    _, _, terminated, _, _ = env.step(bad)
    assert terminated.tolist() == [False, True, False]
    assert torch.isfinite(env.physics.state.ctrl).all()
    assert env.counters["nonfinite_action_resets"] == 1


def test_wrong_action_shape_is_a_clear_error():
    env = _env("so101_reach", n=2)
    env.reset()
    with pytest.raises(ValueError, match=r"expected \[num_envs, action_dim\] = \[2, 6\]"):
        env.step(torch.zeros(2, 5))
    with pytest.raises(TypeError, match="torch.Tensor"):
        env.step([[0.0] * 6] * 2)


def test_step_before_reset_is_refused():
    env = _env("so101_reach", n=1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(torch.zeros(1, 6))


def test_unknown_names_and_bad_values_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown task 'so101_fly'.*so101_lift"):
        make_env("so101_fly")
    with pytest.raises(ValueError, match=r"unknown sim backend 'bullet'.*mujoco"):
        make_env("so101_reach", SimConfig(backend="bullet"))
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        SimConfig(num_envs=0)
    with pytest.raises(ValueError, match=r"no option\(s\) \['episode_lenth'\]"):
        task_config("so101_reach", {"episode_lenth": 3})
    with pytest.raises(ValueError, match="unknown camera"):
        make_env("so101_lift", task_cfg=task_config("so101_lift", {"cameras": ["top"]}))


@pytest.mark.parametrize("task", task_names())
def test_state_dict_round_trip_continues_identically(task):
    """A resumed env steps the same numbers as the one that never stopped: every observation group and reward (for
    humanoid_walk this needs its noise and command generator in the state: it draws between resets)."""
    env = _env(task, n=2)
    env.reset(seed=5)
    actions = _rand_actions(20, 2, env.action_dim, 1)
    for a in actions[:10]:
        env.step(a)
    sd = env.state_dict()
    out_a = [env.step(a)[:2] for a in actions[10:]]
    env2 = _env(task, n=2, seed=99)
    env2.reset(seed=3)
    env2.load_state_dict(sd)
    out_b = [env2.step(a)[:2] for a in actions[10:]]
    for (obs_a, r_a), (obs_b, r_b) in zip(out_a, out_b, strict=True):
        assert torch.equal(r_a, r_b) and obs_a.keys() == obs_b.keys()
        assert all(torch.equal(obs_a[k], obs_b[k]) for k in obs_a)


def test_without_autoreset_ended_envs_wait_for_their_reset():
    env = make_env("so101_reach", SimConfig(num_envs=3, autoreset=False),
                   task_config("so101_reach", {"episode_length": 3}))
    assert not env.autoreset
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, _, terminated, truncated, info = env.step(torch.zeros(3, 6))
    assert truncated.all() and not terminated.any()
    assert torch.equal(obs[keys.POLICY], info[keys.FINAL_OBS][keys.POLICY])  # the last observation, not a new one
    assert info[keys.EPISODE][keys.EP_LENGTH].tolist() == [3, 3, 3]
    with pytest.raises(RuntimeError, match=r"envs \[0, 1, 2\] ended and sim.autoreset is off"):
        env.step(torch.zeros(3, 6))
    before = obs[keys.POLICY].clone()
    obs, _ = env.reset(env_ids=torch.tensor([1]))
    assert torch.equal(obs[keys.POLICY][[0, 2]], before[[0, 2]])  # other envs untouched
    assert not torch.equal(obs[keys.POLICY][1], before[1])
    with pytest.raises(RuntimeError, match=r"envs \[0, 2\] ended"):
        env.step(torch.zeros(3, 6))
    env.reset(env_ids=torch.tensor([0, 2]))
    assert env.episodes.lengths.tolist() == [0, 0, 0]
    _, _, terminated, truncated, info = env.step(torch.zeros(3, 6))
    assert not (terminated | truncated).any() and env.episodes.lengths.tolist() == [1, 1, 1]


def test_first_reset_resets_every_env():
    env = _env("so101_reach", n=2)
    with pytest.raises(RuntimeError, match="first reset"):
        env.reset(env_ids=torch.tensor([0]))


def test_applied_action_and_actor_in_info():
    env = make_env("so101_reach", SimConfig(num_envs=3, on_nonfinite_action="reset"))
    env.reset(seed=0)
    action = torch.tensor([[2.0, -3.0, 0.5, 0.0, 0.0, 0.0]] * 3)
    action[2, 0] = float("nan")
    _, _, _, _, info = env.step(action)
    applied = info[keys.APPLIED_ACTION]
    assert applied.shape == (3, 6) and applied.dtype == torch.float32
    assert applied[0].tolist() == [1.0, -1.0, 0.5, 0.0, 0.0, 0.0]  # clipped to [-1, 1]
    assert applied[2].tolist() == [0.0] * 6  # the rejected non-finite row
    assert info[keys.ACTOR].tolist() == [keys.ACTOR_POLICY] * 3 and info[keys.ACTOR].dtype == torch.long
    _, _, _, _, info = env.step(torch.zeros(3, 6), actor=keys.ACTOR_HUMAN)
    assert info[keys.ACTOR].tolist() == [keys.ACTOR_HUMAN] * 3
    who = torch.tensor([keys.ACTOR_POLICY, keys.ACTOR_RECOVERY, keys.ACTOR_HUMAN])
    _, _, _, _, info = env.step(torch.zeros(3, 6), actor=who)
    assert torch.equal(info[keys.ACTOR], who)
    with pytest.raises(ValueError, match="actor"):
        env.step(torch.zeros(3, 6), actor=7)


class _ColourReach:
    """so101_reach whose instruction names a colour drawn at each reset (the shape of so101_pick's)."""

    COLOURS = ("red", "green", "blue")

    @staticmethod
    def make(n: int):
        from sim.tasks.so101_reach import ReachConfig, ReachTask

        class ColourReachTask(ReachTask):
            def bind(self, model, num_envs, device):
                super().bind(model, num_envs, device)
                self.colour = torch.zeros(num_envs, dtype=torch.long)

            def reset(self, state, env_ids, gen):
                super().reset(state, env_ids, gen)
                self.colour[env_ids] = torch.randint(0, 3, (len(env_ids),), generator=gen)

            def instructions(self, num_envs):
                return [f"touch the {_ColourReach.COLOURS[c]} target" for c in self.colour.tolist()]

        return make_env(ColourReachTask(ReachConfig(episode_length=2)), SimConfig(num_envs=n))


def test_instructions_are_per_env_and_follow_resets():
    env = _env("so101_lift", n=3)
    env.reset(seed=0)
    assert env.instructions == [env.task.instruction] * 3
    env = _ColourReach.make(16)
    env.reset(seed=0)
    first = env.instructions
    assert len(first) == 16 and len(set(first)) > 1  # each env its own text
    assert env.instructions is first  # no reset since: not rebuilt
    assert [s.split()[2] for s in first] == [_ColourReach.COLOURS[c] for c in env.task.colour.tolist()]
    env.step(torch.zeros(16, 6))
    env.step(torch.zeros(16, 6))  # every episode ends (2 steps) and auto-resets with a new draw
    assert env.instructions != first
    assert [s.split()[2] for s in env.instructions] == [_ColourReach.COLOURS[c] for c in env.task.colour.tolist()]


def test_a_misspelled_reward_weight_is_an_error_naming_it():
    cfg = task_config("so101_lift", {"reward_weights": {"reach": 2.0, "lfit": 2.0}})
    with pytest.raises(ValueError, match=r"unknown reward weight\(s\) \['lfit'\].*'lift'"):
        make_env("so101_lift", SimConfig(num_envs=1), cfg)
    env = make_env("so101_lift", SimConfig(num_envs=1), task_config("so101_lift", {"reward_weights": {"lift": 1.0}}))
    env.reset(seed=0)
    _, reward, _, _, info = env.step(torch.zeros(1, 6))  # terms left out weigh 0: only lift counts
    assert info[keys.LOG]["reward/reach"] == 0.0 and reward.item() == pytest.approx(info[keys.LOG]["reward/lift"])


def test_mujoco_envs_are_resumable():
    env = _env("so101_reach", n=1)
    assert env.resumable


def test_reward_terms_out_of_order_are_refused_naming_both():
    """The env weighs the terms by position (``Task.reward_term_matrix``): a task returning them in another order than
    its ``reward_term_names`` would weigh each by another's weight, so the first step refuses it."""
    from sim.registry import make_task

    task = make_task("so101_reach")
    terms_of = task.reward_terms
    task.reward_terms = lambda state, action: dict(reversed(list(terms_of(state, action).items())))
    env = make_env(task, SimConfig(num_envs=2))
    env.reset(seed=0)
    names = list(task.reward_term_names)
    with pytest.raises(RuntimeError, match=f"returned {re.escape(str(names[::-1]))}.*are {re.escape(str(names))}"):
        env.step(torch.zeros(2, 6))
