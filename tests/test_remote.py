"""The actor/learner split end to end, in real processes over localhost (RELIABILITY.md E1, E2): ``robot-rl train
remote.listen=...`` and ``robot-rl actor``, with the faults made for real (SIGKILL of an actor, of the learner).

The drill: learner L1 and actor A start; A is killed (-9) and B takes its slot (E2: connected within 10 s); L1 is
killed (-9): B notices within 5 s and holds; L2 resumes L1's last checkpoint on the same port, B reconnects within
30 s and resends what the checkpoint lacks; the run ends at its step budget and tells B to stop. The final
checkpoint's replay buffer then holds an unbroken stream: every stored o' is the next stored o of its env (except
where an episode ended, and where B's new envs began), and the steps stored are exactly the messages' steps, so no
transition was lost or stored twice across either kill.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.remote import TOKEN, actor_command, cli, env_vars, fault_drill, free_port, run_split
from robot_rl.checkpoint import load_checkpoint
from robot_rl.cli.build import build_training, compose
from tests.test_lerobot_loader import tree_hash

STEPS_PER_MESSAGE = 2
NUM_ENVS = 4


def test_fault_drill_kills_an_actor_and_the_learner_and_loses_no_transition(tmp_path: Path):
    d = fault_drill(tmp_path, total_steps=8_000, num_envs=NUM_ENVS, steps_per_message=STEPS_PER_MESSAGE)
    assert d["learner_rc"] == 0 and d["actor_rc"] == 0 and d["resumed"]
    assert d["replacement_connect_s"] <= 10.0  # E2 (the process's start-up included)
    assert d["learner_loss_detected_s"] <= 5.0  # E1
    assert not d["acted_while_learner_dead"]  # (what the last checkpoint lacks waits in B's spool: resent below)
    assert d["reconnect_after_restart_s"] <= 60.0  # E1 asks <= 30 s after the learner is up; here its start-up too
    r = d["actor_report"]
    assert r["stopped_by_learner"] and r["holds"] == 1 and r["reconnects"] == 1 and r["dropped"] == 0
    assert r["detect_s"] and max(r["detect_s"]) <= 5.0
    # no gap and no duplicate: the steps stored are exactly the messages' steps, and every env's chain is unbroken
    assert d["steps_stored"] == d["steps_expected"] and d["missing_or_duplicated_steps"] == 0
    assert d["env_steps"] == d["steps_stored"] * NUM_ENVS >= 8_000
    assert d["replay_rows"] == d["steps_stored"]  # the buffer never wrapped: the whole stream is there
    assert d["chain_links"] > 0.9 * d["replay_rows"] * NUM_ENVS * 0.9 and d["chain_breaks"] == 0


def test_a_remote_learner_checkpoint_resumes_only_as_one(tmp_path: Path):
    """Without the drill's processes: a checkpoint from a remote learner, resumed without remote.listen, is refused
    before anything is written, and so is remote.listen with PPO."""
    env = env_vars()
    out = subprocess.run([sys.executable, "-m", "robot_rl.cli.main", "train", "algo=ppo",
                          "remote.listen=127.0.0.1:0", f"run_dir={tmp_path / 'ppo'}"], check=False, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "remote actors feed an off-policy learner (algo=flashsac)" in out.stderr
    assert not (tmp_path / "ppo").exists()
    out = subprocess.run([sys.executable, "-m", "robot_rl.cli.main", "actor", "remote.address=127.0.0.1:1",
                          "remote.connect_timeout_s=1"], check=False, env={**env, "ROBOT_RL_TOKEN": ""},
                         capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "no token" in out.stderr


@pytest.mark.slow
def test_remote_flashsac_learns_so101_reach():
    """One actor of 16 envs feeding a learner (FlashSAC's recipe): 90 % rolling training success on so101_reach
    within the one-process budget of 200 k env steps."""
    r = run_split(0)
    assert r["env_steps_to_90"] is not None and r["policies_received"] > 10


def test_two_actors_fill_their_own_slots(tmp_path: Path):
    """remote.actors=2: each actor's stream lands whole and unbroken in its own slot's replay, the reward statistics
    cover both slots' envs, and both are stopped when the run ends."""
    port, run = free_port(), tmp_path / "run"
    learner = subprocess.Popen(cli("train", "task=so101_reach", "algo=flashsac", f"remote.listen=127.0.0.1:{port}",
                                   "remote.actors=2", f"sim.num_envs={NUM_ENVS}", "algo.learning_starts=64",
                                   "algo.batch_size=32", "algo.actor.hidden_dim=16", "algo.critic.hidden_dim=16",
                                   "remote.max_lead_steps=16", "torch_threads=1", "total_steps=3000",
                                   "eval.enabled=false", "logger.progress=false", "logger.tensorboard=false",
                                   f"run_dir={run}"), env=env_vars(), stdout=subprocess.DEVNULL,
                               stderr=(tmp_path / "l.err").open("wb"))
    actors = [subprocess.Popen(actor_command(port, tmp_path / f"spool{i}", f"sim.num_envs={NUM_ENVS}",
                                             f"remote.actor_id={i}", f"seed={i}", "remote.steps_per_message=2"),
                               env=env_vars(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for i in (0, 1)]
    try:
        assert learner.wait(timeout=300) == 0, (tmp_path / "l.err").read_text()[-3000:]
        reports = [json.loads(a.communicate(timeout=60)[0]) for a in actors]
    finally:
        for p in (learner, *actors):
            if p.poll() is None:
                p.kill()
    assert all(r["stopped_by_learner"] for r in reports)
    runner = load_checkpoint(run).state["runner"]
    algo = load_checkpoint(run).state["algo"]
    assert algo["return_scale"]["g"].shape == (2 * NUM_ENVS,)
    total = 0
    for slot, replay in enumerate(runner["replays"]):
        received, steps = runner["remote"]["received"][slot], runner["remote"]["steps"][slot]
        assert steps == (received + 1) * 2 and int(replay["size"]) == steps > 0
        size = steps
        obs, nxt = replay["obs"]["policy"][:size], replay["next_obs"]["policy"][:size]
        cont = ~(replay["terminated"][:size] | replay["truncated"][:size])[:-1]
        assert torch.equal(nxt[:-1][cont], obs[1:][cont])
        total += steps * NUM_ENVS
    assert runner["env_steps"] == total >= 3000
    # each actor's own envs (seeded apart) are in its own slot: the first observations differ
    assert not torch.equal(runner["replays"][0]["obs"]["policy"][0], runner["replays"][1]["obs"]["policy"][0])


def test_a_learner_waiting_for_actors_stops_on_its_clock_and_writes_one_checkpoint(tmp_path: Path):
    """No actor ever comes: the learner's iterations still end (every 2 s), max_minutes stops it, and a checkpoint
    is not rewritten while nothing new arrived (checkpoint_every=1 would otherwise write one per iteration)."""
    run = tmp_path / "run"
    out = subprocess.run(cli("train", "task=so101_reach", "algo=flashsac", f"remote.listen=127.0.0.1:{free_port()}",
                             "max_minutes=0.12", "checkpoint_every=1", "eval.enabled=false", "logger.progress=false",
                             "logger.tensorboard=false", f"run_dir={run}"), check=False, env=env_vars(),
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list((run / "checkpoints").glob("iter_*"))) == 1
    assert len((run / "curve.jsonl").read_text().splitlines()) >= 3


def _small_learner(port: int, total_steps: int, *extra: str) -> list[str]:
    """An in-process learner's settings: so101_reach, tiny networks, stopped by its step budget (or 3 minutes)."""
    return ["task=so101_reach", "algo=flashsac", f"remote.listen=127.0.0.1:{port}", f"sim.num_envs={NUM_ENVS}",
            "algo.learning_starts=64", "algo.batch_size=32", "algo.actor.hidden_dim=16", "algo.critic.hidden_dim=16",
            "torch_threads=1", f"total_steps={total_steps}", "max_minutes=3", "eval.enabled=false",
            "logger.progress=false", "logger.tensorboard=false", *extra]


def _learn_beside_an_actor(run, port: int, spool: Path, *actor_args: str) -> tuple[list[object], dict]:
    """Train ``run`` (built in this process) while a real ``robot-rl actor`` feeds it; returns what each update was
    given as its offline half (the real update, watched) and the actor's report."""
    drawn: list[object] = []
    update = run.algo.update

    def watched(replay, offline=None):
        drawn.append(offline)
        return update(replay, offline)

    run.algo.update = watched
    actor = subprocess.Popen(actor_command(port, spool, f"sim.num_envs={NUM_ENVS}", "remote.steps_per_message=2",
                                           *actor_args), env=env_vars(), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        run.runner.learn()
        out, _ = actor.communicate(timeout=60)
        assert actor.returncode == 0
    finally:
        run.close()
        if actor.poll() is None:
            actor.kill()
    return drawn, json.loads(out)


def test_a_remote_learner_mixes_its_demo_dataset_into_every_batch(tmp_path: Path, monkeypatch):
    """demo_dataset.root with remote.listen: the demos load beside the learner (the dataset only read) and every
    update draws its RLPD half from them, as in one process; hil.person on the learner is pointed to the actors."""
    root = tmp_path / "demos"
    out = subprocess.run(cli("collect", "task=so101_reach", "episodes=4", f"dataset.root={root}", "env_state=true",
                             "task.cameras=[]", "sim.num_envs=2", "progress=false"), check=False, env=env_vars(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    before = tree_hash(root)
    monkeypatch.setenv("ROBOT_RL_TOKEN", TOKEN)
    port = free_port()
    settings = _small_learner(port, 800, f"demo_dataset.root={root}")
    with pytest.raises(ValueError, match="hil.person goes on the actors"):
        build_training(compose("train", [*settings, "hil.person=expert", f"run_dir={tmp_path / 'refused'}"]))
    run = build_training(compose("train", [*settings, f"run_dir={tmp_path / 'run'}"]))
    demo = run.runner.demo
    assert demo is not None and demo.size == 32  # the 4 episodes' frames (8 each: reach's expert succeeds fast)
    drawn, _ = _learn_beside_an_actor(run, port, tmp_path / "spool")
    assert len(drawn) > 10 and all(d is demo for d in drawn)
    assert tree_hash(root) == before


def test_a_person_on_the_actor_drives_tagged_transitions_into_the_learners_offline_half(tmp_path: Path, monkeypatch):
    """robot-rl actor hil.person=expert (HIL-SERL's person, where the envs are): the scripted expert takes over every
    episode after 3 steps; its transitions reach the learner tagged (the checkpoint's replay), the learner's updates
    draw them as the offline half once the first arrived, and the episodes it touched do not count as the policy's
    (the rolling statistics hold exactly the episodes the replay shows untouched)."""
    from policies import keys
    from robot_rl.buffers.interventions import Sources

    monkeypatch.setenv("ROBOT_RL_TOKEN", TOKEN)
    port, run_dir = free_port(), tmp_path / "run"
    run = build_training(compose("train", _small_learner(port, 1200, f"run_dir={run_dir}")))
    drawn, report = _learn_beside_an_actor(run, port, tmp_path / "spool", "hil.person=expert", "hil.judge=deadline",
                                           "hil.after=3")
    assert report["intervention_steps"] > 0 and report["hil"]["hil/takeovers"] > 0
    assert run.runner.interventions > 0
    assert drawn and isinstance(drawn[-1], Sources) and drawn[-1].size > 0  # the person's transitions, drawn apart
    replay = load_checkpoint(run_dir).state["runner"]["replays"][0]
    size = int(replay["size"])
    tags = replay["actor"][:size]
    assert int((tags == keys.ACTOR_HUMAN).sum()) == run.runner.interventions
    done = replay["terminated"][:size] | replay["truncated"][:size]
    alone, touched = 0, torch.zeros(NUM_ENVS, dtype=torch.bool)  # episodes the person never touched, from the replay
    for row in range(size):
        touched |= tags[row] != keys.ACTOR_POLICY
        alone += int((done[row] & ~touched).sum())
        touched &= ~done[row]
    assert run.runner.stats.count == alone < int(done.sum()) / 2  # only those counted, and most were touched


def test_an_actor_shapes_its_rewards_at_the_discount_the_learner_sent(tmp_path: Path, monkeypatch):
    """robot-rl actor reward.progress=<model>: the learner (its discount set to 0.9 to see it travel) stores exactly the
    rewards that robot_rl.rewards.ShapedEnv gives here for the same env, seed and actions at γ = 0.9, not the task's
    own; reward.progress on the learner itself is pointed to the actors."""
    from robot_rl.cli.build import build_env, build_shaping
    from robot_rl.cli.config import RewardSettings
    from robot_rl.cli.main import main

    demos, model = tmp_path / "demos", tmp_path / "progress"
    assert main(["collect", "task=so101_reach", "episodes=6", f"dataset.root={demos}", "env_state=true",
                 "task.cameras=[]", "sim.num_envs=2", "progress=false"]) == 0
    assert main(["progress", f"dataset.root={demos}", f"run_dir={model}", "steps=20", "progress=false"]) == 0
    monkeypatch.setenv("ROBOT_RL_TOKEN", TOKEN)
    port, run_dir = free_port(), tmp_path / "run"
    settings = _small_learner(port, 400, "algo.gamma=0.9")
    with pytest.raises(ValueError, match="reward.progress goes on the actors"):
        build_training(compose("train", [*settings, f"reward.progress={model}", f"run_dir={tmp_path / 'no'}"]))
    run = build_training(compose("train", [*settings, f"run_dir={run_dir}"]))
    _learn_beside_an_actor(run, port, tmp_path / "spool", "seed=0", f"reward.progress={model}", "reward.scale=5")
    replay = load_checkpoint(run_dir).state["runner"]["replays"][0]
    size = int(replay["size"])
    assert size >= 400 // NUM_ENVS
    cfg = compose("actor", [f"sim.num_envs={NUM_ENVS}"])  # the actor's env, built as robot-rl actor builds it
    plain = build_env(dict(cfg.task), dict(cfg.sim))
    shaped = build_shaping(RewardSettings(progress=str(model), scale=5.0), build_env(dict(cfg.task), dict(cfg.sim)),
                           0.9)
    try:
        plain.reset(seed=0)
        shaped.reset(seed=0)
        got, task_own, want = replay["reward"][:size], [], []
        for row in range(size):
            task_own.append(plain.step(replay["action"][row])[1])
            want.append(shaped.step(replay["action"][row])[1])
    finally:
        plain.close()
        shaped.close()
    torch.testing.assert_close(got, torch.stack(want))
    assert not torch.allclose(got, torch.stack(task_own))
