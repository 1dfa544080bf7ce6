"""Online take-overs (HIL-SERL in simulation): the person's judgment (ActionGap), the intervention agent, the replay's
interventions as RLPD's offline half, and `robot-rl train hil.person=expert` end to end, resumed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from policies import keys
from robot_rl.buffers.interventions import Interventions, Sources
from robot_rl.buffers.replay import ReplayBuffer, sample_mixed
from robot_rl.cli.main import main
from robot_rl.hil import ActionGap, Deadline, InterventionAgent, action_gap


def test_action_gap_by_hand():
    torch.testing.assert_close(action_gap(torch.tensor([[1.0, 0.0], [0.3, -0.4]]), torch.zeros(2, 2)),
                               torch.tensor([math.sqrt(0.5), math.sqrt(0.125)]))
    trig = ActionGap(threshold=0.5, patience=2, hold=3, num_envs=1)
    gaps = [0.9, 0.9, 0.0, 0.0, 0.0, 0.9, 0.2, 0.9, 0.9]
    # over for 2 steps -> asks at step 1 and holds 3 steps (1, 2, 3) whatever the gap; then counts afresh: step 5's
    # gap is cut short by step 6's, steps 7-8 ask again
    fired = [bool(trig(torch.tensor([g]))[0]) for g in gaps]
    assert fired == [False, True, True, True, False, False, False, False, True]
    # the steps of a take-over do not count toward the next one: a gap that persists through it needs `patience`
    # steps again afterwards
    trig = ActionGap(threshold=0.5, patience=2, hold=2, num_envs=1)
    assert [bool(trig(torch.tensor([0.9]))[0]) for _ in range(6)] == [False, True, True, False, True, True]
    trig.reset(None)  # a new episode ends the take-over
    assert not bool(trig(torch.tensor([0.0]))[0])
    with pytest.raises(ValueError, match="action gap"):
        trig(None)
    with pytest.raises(ValueError, match="hold >= 1"):
        ActionGap(0.5, 1, 0, 1)


def test_the_deadline_asks_from_its_step_until_the_episode_ends():
    trig = Deadline(after=2, num_envs=2)
    assert [trig(None).tolist() for _ in range(4)] == [[False, False], [False, False], [True, True], [True, True]]
    trig.reset(torch.tensor([1]))  # env 1's episode ended: the policy has it alone again
    assert trig(torch.zeros(2)).tolist() == [True, False]


class PlusOne:
    """A stand-in person for one env who would always command +1 (counts the resets it gets)."""

    def __init__(self) -> None:
        self.resets: list[list[int] | None] = []
        self.acts = 0

    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.acts += 1
        return torch.ones(1, 2)

    def reset(self, env_ids: torch.Tensor | None) -> None:
        self.resets.append(None if env_ids is None else env_ids.tolist())


def test_the_agent_reacts_a_step_late_holds_and_hands_back():
    person = PlusOne()
    agent = InterventionAgent(person, ActionGap(0.5, 1, 2, 1), 1)
    policy = [-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]  # disagrees (gap 2) for three steps, then agrees (gap 0)
    actors, applied = [], []
    for p in policy:
        a, who = agent({}, torch.full((1, 2), p))
        actors.append(int(who[0]))
        applied.append(float(a[0, 0]))
    # step t's decision reads step t-1's gap: asks at 1 (holds 1-2), again at 3 (step 2 still disagreed; holds 3-4),
    # and step 5 sees step 4's agreement
    h, p = keys.ACTOR_HUMAN, keys.ACTOR_POLICY
    assert actors == [p, h, h, h, h, p]
    assert applied == [-1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # the person's +1 where they drive, the policy's elsewhere
    assert not bool(agent.alone(torch.tensor([True]))[0])  # helped: not the policy's own episode
    agent.end(torch.tensor([True]), torch.tensor([True]))
    assert person.resets == [[0]] and agent.successes == 1 and float(agent.gap[0]) == 0.0
    agent({}, torch.ones(1, 2))  # a new episode the policy drives alone so far
    assert bool(agent.alone(torch.tensor([True]))[0]) and not bool(agent.alone(torch.tensor([False]))[0])
    rep = agent.report()
    assert rep["hil/takeovers"] == 1.0 and rep["hil/steps/human"] == 4.0 and rep["hil/takeovers_per_success"] == 1.0
    again = InterventionAgent(PlusOne(), ActionGap(0.5, 1, 2, 1), 1)
    again.load_state_dict(agent.state_dict())
    assert again.report()["hil/steps/human"] == 4.0 and again.person.resets == [None]  # counts go on; plan afresh


def test_a_person_who_does_not_watch_acts_only_once_they_take_over_and_plans_afresh():
    person = PlusOne()
    agent = InterventionAgent(person, Deadline(2, 1), 1, watch=False)
    got = [agent({}, -torch.ones(1, 2)) for _ in range(4)]
    assert [float(a[0, 0]) for a, _ in got] == [-1.0, -1.0, 1.0, 1.0]
    assert [int(w[0]) for _, w in got] == [keys.ACTOR_POLICY] * 2 + [keys.ACTOR_HUMAN] * 2
    assert person.acts == 2 and person.resets == [[0]]  # nothing asked of them before step 2; a fresh plan then
    with pytest.raises(ValueError, match="must watch"):
        InterventionAgent(PlusOne(), ActionGap(0.5, 1, 1, 1), 1, watch=False)


def _replay(actors: list[list[int]], rewards: list[float] | None = None, capacity: int = 64) -> ReplayBuffer:
    """Two envs; step t's observation of env e is 10 t + e."""
    rb = ReplayBuffer(capacity, 2, {keys.POLICY: (1,)}, 1, "cpu")
    for t, who in enumerate(actors):
        obs = {keys.POLICY: torch.tensor([[10.0 * t], [10.0 * t + 1]])}
        nxt = {keys.POLICY: obs[keys.POLICY] + 10.0}
        r = torch.full((2,), rewards[t] if rewards else 0.0)
        rb.add(obs, torch.zeros(2, 1), r, torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool), nxt,
               actor=torch.tensor(who))
    return rb


def test_the_replay_draws_interventions_apart_after_wrapping_with_their_n_step_windows():
    h, p = keys.ACTOR_HUMAN, keys.ACTOR_POLICY
    # 3 rows x 2 envs: after 5 steps the rows hold steps 2, 3, 4; of them env 1 of step 2 and env 0 of step 4 are
    # interventions (step 0's, overwritten, is not)
    rb = _replay([[h, h], [p, p], [p, h], [p, p], [h, p]], rewards=[0, 0, 1.0, 2.0, 4.0], capacity=6)
    assert rb.num_interventions == 2 and Interventions(rb).size == 2
    batch = rb.sample(200, n_step=2, gamma=0.5, interventions=True)
    seen = batch[keys.OBS][keys.POLICY][:, 0]
    assert set(seen.tolist()) == {21.0, 40.0} and bool((batch[keys.ACTOR] == h).all())
    # step 2 of env 1: r 1 + 0.5 * r 2 of step 3 (a policy step: the window runs on), o' of step 3; step 4 is the
    # newest row, its window is cut there
    at21, at40 = seen == 21.0, seen == 40.0
    assert torch.all(batch[keys.REWARD][at21] == 2.0) and torch.all(batch[keys.NEXT_OBS][keys.POLICY][at21] == 41.0)
    assert torch.all(batch[keys.REWARD][at40] == 4.0) and torch.all(batch[keys.NEXT_OBS][keys.POLICY][at40] == 50.0)
    with pytest.raises(RuntimeError, match="no intervention"):
        _replay([[p, p]]).sample(4, interventions=True)


def test_plain_sampling_draws_the_same_stream_as_before():
    """The draw without ``interventions`` is torch.randint over every stored transition, as it always was (seeded
    runs and their checkpoints stay bitwise what they were)."""
    rb = _replay([[0, 1], [0, 0], [1, 0]])
    torch.manual_seed(3)
    got = rb.sample(16)[keys.OBS][keys.POLICY][:, 0]
    torch.manual_seed(3)
    flat = torch.randint(rb.size * 2, (16,))
    assert torch.equal(got, (flat // 2 * 10 + flat % 2).float())


def test_rlpd_batches_draw_their_offline_half_from_interventions_and_demos_by_size():
    h, p = keys.ACTOR_HUMAN, keys.ACTOR_POLICY
    online = _replay([[p, h], [p, p], [h, h]])  # 3 interventions among 6
    batch = sample_mixed(online, Interventions(online), 256, 0.5)
    assert bool((batch[keys.ACTOR][128:] == h).all()) and int((batch[keys.ACTOR][:128] == h).sum()) > 0
    demos = ReplayBuffer(16, 1, {keys.POLICY: (1,)}, 1, "cpu")  # 9 demo transitions, observation -1
    for _ in range(9):
        o = {keys.POLICY: torch.full((1, 1), -1.0)}
        demos.add(o, torch.zeros(1, 1), torch.zeros(1), torch.zeros(1, dtype=torch.bool),
                  torch.zeros(1, dtype=torch.bool), o)
    both = Sources(demos, Interventions(online))
    assert both.size == 12
    torch.manual_seed(0)
    drawn = both.sample(6000)[keys.OBS][keys.POLICY][:, 0]
    assert abs(float((drawn == -1.0).float().mean()) - 0.75) < 0.03  # 9 of the 12 transitions are demos
    with pytest.raises(RuntimeError, match="no source"):
        Sources(Interventions(_replay([[p, p]]))).sample(4)


SMALL = ["task=so101_lift", "algo=flashsac", "task.episode_length=40", "sim.num_envs=2", "sim.num_threads=1",
         "algo.learning_starts=64", "algo.batch_size=32", "algo.steps_per_iteration=16", "eval.enabled=false",
         "logger.progress=false", "logger.tensorboard=false", "checkpoint_every=5"]


def test_robot_rl_train_with_the_expert_finishing_late_episodes(tmp_path, capsys):
    """hil.judge=deadline: the expert drives only from step 10 of an episode on, so never its first 10 steps."""
    from robot_rl.checkpoint import load_checkpoint

    run = tmp_path / "run"
    assert main(["train", *SMALL, "hil.person=expert", "hil.judge=deadline", "hil.after=10", "total_steps=320",
                 f"run_dir={run}"]) == 0
    replay = load_checkpoint(run).state["runner"]["replay"]
    actor = replay["actor"]  # [T, N] in time order (no wrap at this size)
    ended = replay["terminated"] | replay["truncated"]
    for env in range(actor.shape[1]):
        t_in_episode = 0
        for t in range(actor.shape[0]):
            assert (int(actor[t, env]) == keys.ACTOR_HUMAN) == (t_in_episode >= 10), (t, env)
            t_in_episode = 0 if bool(ended[t, env]) else t_in_episode + 1
    assert int((actor == keys.ACTOR_HUMAN).sum()) > 0


def test_robot_rl_train_with_the_expert_taking_over_end_to_end_and_resumed(tmp_path, capsys):
    from robot_rl.checkpoint import load_checkpoint

    run = tmp_path / "run"
    assert main(["train", *SMALL, "hil.person=expert", "hil.judge=gap", "total_steps=320", f"run_dir={run}"]) == 0
    assert "trained 320 env steps" in capsys.readouterr().err
    points = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
    # a fresh policy strays from the expert: the expert drives most of the first steps
    assert len(points) == 10 and points[0]["intervention_rate"] > 0.5
    state = load_checkpoint(run).state["runner"]
    human = int(state["hil"]["steps"][keys.ACTOR_HUMAN])
    drove = (state["replay"]["actor"] == keys.ACTOR_HUMAN).sum()
    assert human == int(drove) > 0  # every step the expert drove is in the replay, tagged
    assert main(["train", *SMALL, "hil.person=expert", "hil.judge=gap", "total_steps=480", f"resume={run}"]) == 0
    assert "resumed from" in capsys.readouterr().err
    after = load_checkpoint(run).state["runner"]["hil"]
    assert int(after["steps"].sum()) == 480 and int(after["steps"][keys.ACTOR_HUMAN]) >= human  # counts continued


def test_the_learner_mixes_the_experts_transitions_into_every_batch(tmp_path):
    """Through the build API: each update gets the replay's interventions as RLPD's offline half, and a batch drawn
    as FlashSAC draws it holds them in its second half."""
    from robot_rl.cli.build import build_training, compose

    run = build_training(compose("train", [*SMALL, "hil.person=expert", "hil.judge=gap", "total_steps=160", f"run_dir={tmp_path}"]))
    try:
        algo, seen = run.runner.algo, []
        update = algo.update

        def spy(replay, demo=None):
            seen.append((demo.size, replay.num_interventions))
            return update(replay, demo)

        algo.update = spy
        run.runner.start()
        for _ in range(6):
            run.runner.run_iteration()
        assert isinstance(run.runner.offline, Interventions) and seen
        assert all(offline == drove > 0 for offline, drove in seen)
        # the rolling statistics hold only the episodes the policy drove alone
        assert run.runner.hil.episodes > 0 and run.runner.stats.count < run.runner.hil.episodes
        cfg = algo.cfg
        batch = sample_mixed(run.runner.replay, run.runner.offline, cfg.batch_size, cfg.demo_fraction)
        assert bool((batch[keys.ACTOR][cfg.batch_size // 2:] == keys.ACTOR_HUMAN).all())
    finally:
        run.close()


def test_bad_hil_settings_fail_before_a_run_folder_is_written(tmp_path, capsys):
    base = ["task=so101_lift", "sim.num_envs=2", "sim.num_threads=1", "logger.progress=false",
            "logger.tensorboard=false"]
    cases = [(["algo=ppo", "hil.person=expert"], "off-policy learners"),
             (["algo=flashsac", "hil.person=bob"], "hil.person must be null or 'expert'"),
             (["algo=flashsac", "hil.person=expert", "hil.hold=0"], "hil.hold >= 1"),
             (["algo=flashsac", "hil.person=expert", "hil.judge=vibes"], "hil.judge must be 'gap' or 'deadline'"),
             (["algo=flashsac", "hil.persn=expert"], "hil.persn")]
    for i, (extra, message) in enumerate(cases):
        run = tmp_path / f"run{i}"
        assert main(["train", *base, *extra, f"run_dir={run}"]) == 2, extra
        assert message in capsys.readouterr().err, extra
        assert not run.exists(), extra


def test_the_learning_curve_of_a_hil_run_shows_the_persons_share(tmp_path):
    import matplotlib.image

    from robot_rl.logging import plot_learning_curve

    points = [{"iteration": i, "env_steps": 256 * i, "wall_s": 1.0 * i, "success_rate": 0.1 * i, "mean_return": -i}
              for i in range(1, 5)]
    plain = matplotlib.image.imread(plot_learning_curve(points, tmp_path / "plain.png"))
    helped = [{**p, "intervention_rate": 0.8 - 0.1 * i} for i, p in enumerate(points)]
    hil = matplotlib.image.imread(plot_learning_curve(helped, tmp_path / "hil.png"))
    assert hil.shape[0] == pytest.approx(1.5 * plain.shape[0], rel=0.02)  # a third row of panels
