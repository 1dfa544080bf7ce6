"""The learner of an actor/learner split: an off-policy learner fed over RPC, stepping no env itself.

It serves ``robot_rl.remote.service`` (its state in ``LearnerHub``) and owns the loop: drain what the actors sent into
one replay buffer per actor slot (sampled as one, every stored transition equally likely), keep the algorithm's
updates per env step as in one process (each received vector step adds ``updates_per_step`` updates of debt), publish
the policy every ``publish_every`` updates, and hold actors that run more than ``max_lead_steps`` ahead of the
training. Checkpoints hold the replay buffers and each slot's last sequence number; once written, the actors may
forget those messages (``committed``), so a learner killed and resumed loses and repeats no transition.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save

from policies import keys
from policies.persistence import PROCESSOR_PREFIX, WEIGHTS_FILE, save_policy
from robot_rl.algos.base import OffPolicyAlgorithm
from robot_rl.buffers.interventions import Interventions, Sources
from robot_rl.buffers.replay import ReplayBuffer
from robot_rl.checkpoint import Checkpoint, CheckpointManager
from robot_rl.env import VecEnv
from robot_rl.logging import RunLogger
from robot_rl.remote import wire
from robot_rl.remote.auth import TOKEN_FILE, make_token, read_token
from robot_rl.remote.hub import Batch, LearnerHub, Spec
from robot_rl.remote.service import serve
from robot_rl.remote.settings import RemoteSettings
from robot_rl.runners.common import EpisodeStats, RunnerLoop
from robot_rl.runners.off_policy import OffPolicyRunnerConfig, mean_stats

ADDRESS_FILE = "remote_address"  # in the run folder: HOST:PORT the learner serves on (the port it really got)


class PolicyPublisher:
    """Each published version of the policy as an exported folder (``save_policy``'s files) packed into one wire
    message. The folder's other files (config, processor) are written once and reused while the processor's
    statistics stay as they were; the weights are serialised in memory each time (a publish every 2 updates would
    otherwise write and read the whole folder on disk each time)."""

    def __init__(self) -> None:
        self.static: dict[str, bytes] = {}  # the folder's files but the weights
        self.processor: dict[str, torch.Tensor] | None = None  # the statistics they were written with

    def blob(self, policy: Any, version: int) -> bytes:
        proc = {k: v.detach().cpu().clone() for k, v in policy.processor.state_dict().items()}
        old = self.processor
        if old is None or old.keys() != proc.keys() or not all(torch.equal(old[k], v) for k, v in proc.items()):
            with tempfile.TemporaryDirectory(prefix="robot_rl_publish_") as tmp:
                save_policy(policy, tmp)
                self.static = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())
                               if p.is_file() and p.name != WEIGHTS_FILE}
            self.processor = proc
        weights = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()
                   if not k.startswith(PROCESSOR_PREFIX)}
        return wire.pack_folder({**self.static, WEIGHTS_FILE: st_save(weights)}, {"version": version})


class RemoteLearnerRunner(RunnerLoop):
    """Trains an off-policy algorithm on transitions from ``settings.actors`` remote actors.

    Args:
        env: an env of the actors' task and size (``sim.num_envs`` each): its spec is what actors must match; it is
            reset once and never stepped (the final evaluation runs on it).
        algo: the learner.
        cfg: the run's limits; ``steps_per_iteration`` received vector steps (over all actors) make an iteration.
        logger, checkpoints, meta: as for the in-process runners.
        settings: ``remote.*``.
        run_dir: where the token (when made here) and the served address are written.
        demo: an optional demonstration buffer (``demo_dataset``) mixed into every batch (RLPD), as in one process;
            it lives here, beside the learner, and is rebuilt from its dataset on resume.
    """

    def __init__(self, env: VecEnv, algo: OffPolicyAlgorithm, cfg: OffPolicyRunnerConfig, logger: RunLogger,
                 checkpoints: CheckpointManager | None, meta: dict[str, Any], settings: RemoteSettings,
                 run_dir: Path, demo: ReplayBuffer | None = None) -> None:
        if not isinstance(algo, OffPolicyAlgorithm):
            raise ValueError(f"remote actors need an off-policy learner (algo=flashsac); algo={algo.name} learns "  # noqa: TRY004
                             "from its own current policy's rollouts")
        if settings.listen is None:
            raise ValueError("remote.listen is not set")
        self.env, self.algo, self.cfg, self.logger = env, algo, cfg, logger
        self.checkpoints, self.meta, self.settings, self.run_dir = checkpoints, meta, settings, Path(run_dir)
        self.device = algo.device
        n, k = env.num_envs, settings.actors
        algo.set_num_envs(n * k)  # its reward statistics over every actor's envs (slot a: envs a*n .. a*n + n - 1)
        groups = algo.obs_groups
        shapes = {g: tuple(env.obs_spec.shapes[g]) for g in groups}
        dtypes = {g: env.obs_spec.dtype(g) for g in groups}
        per_slot = math.ceil(algo.replay_capacity / k)
        self.replays = [ReplayBuffer(per_slot, n, shapes, env.action_dim, self.device, dtypes) for _ in range(k)]
        self.sampler = Sources(*self.replays)
        self.demo = demo
        # Transitions a person drove on an actor (hil.person there): RLPD's offline half as well, beside the demos
        # (HIL-SERL), from the first one that arrives; until then the demos alone, as in one process.
        self.interventions = 0  # non-policy transitions received (after a resume: those the replays hold)
        self._with_interventions = Sources(*[x for x in (demo,) if x is not None],
                                           *(Interventions(r) for r in self.replays))
        cfg_a = getattr(algo, "cfg", None)
        exploration = {"zeta_s": float(getattr(cfg_a, "noise_zeta_s", 2.0)),
                       "max_repeat": float(getattr(cfg_a, "noise_max_repeat", 16))}
        lead = -1 if settings.max_lead_steps is None else settings.max_lead_steps
        gamma = getattr(cfg_a, "gamma", None)
        self.hub = LearnerHub(Spec(meta.get("task", ""), n, env.action_dim, shapes, dtypes, exploration, lead,
                                   None if gamma is None else float(gamma), demo is not None), k)
        self.stats = EpisodeStats(cfg.success_window)
        self.iteration, self.env_steps, self.elapsed_s, self.update_debt = 0, 0, 0.0, 0.0
        self.sim_s = 0.0  # no env steps here
        self.steps = [0] * k  # vector steps stored per slot
        self.stored = [-1] * k  # per slot, the last message stored in the replay (what a checkpoint holds)
        self.updates = 0
        self.obs: dict[str, torch.Tensor] | None = None
        self.server: Any = None
        self.publisher = PolicyPublisher()
        self.saved: tuple[list[int], int] | None = None  # (stored, updates) at the last checkpoint
        self.port = 0

    # ------------------------------------------------------------------------------------------- service
    def start(self) -> None:
        super().start()
        if self.server is not None:
            return
        s = self.settings
        token = read_token(s.token_file)
        if token is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            token = make_token(self.run_dir)
            print(f"learner: made a token for the actors in {self.run_dir / TOKEN_FILE} (pass it as "
                  f"remote.token_file=...)", file=sys.stderr)
        tls = None
        if s.tls_cert is not None and s.tls_key is not None:
            tls = (Path(s.tls_cert).read_bytes(), Path(s.tls_key).read_bytes())
        self.server, self.port = serve(self.hub.handlers(), s.listen, token, max_workers=4 * s.actors + 8,
                                       max_bytes=s.max_message_mb * 2**20, tls=tls)
        host = s.listen.rsplit(":", 1)[0]
        (self.run_dir / ADDRESS_FILE).write_text(f"{host}:{self.port}\n")
        if self.hub.version == 0 and self.updates > 0:  # resumed: the actors get the restored policy at once
            self.hub.publish(self.publisher.blob(self.algo.policy, 1))
        print(f"learner: serving {s.actors} actor slot(s) of {self.env.num_envs} envs on {host}:{self.port} "
              f"(robot-rl actor remote.address={host}:{self.port} remote.actor_id=0..{s.actors - 1})",
              file=sys.stderr)

    def shutdown(self, wait_s: float = 5.0) -> None:
        """Tell the actors to stop (their next call's answer) and close the service once they heard it."""
        if self.server is None:
            return
        self.hub.set_stop()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not self.hub.all_told():
            time.sleep(0.05)
        self.server.stop(grace=1.0).wait()
        self.server = None

    def learn(self) -> dict[str, float]:
        try:
            return super().learn()
        finally:
            self.shutdown()

    # ------------------------------------------------------------------------------------------- training
    @property
    def transitions(self) -> int:
        return sum(r.num_transitions for r in self.replays)

    def _store(self, b: Batch) -> None:
        n, t = self.env.num_envs, b.tensors
        replay, envs = self.replays[b.actor_id], slice(b.actor_id * n, (b.actor_id + 1) * n)
        if b.new_session:  # another actor process (new envs): its predecessor's unfinished episodes end here
            replay.cut_episodes()
            self.algo.observe(torch.zeros(n, device=self.device), torch.zeros(n, dtype=torch.bool,
                              device=self.device), torch.ones(n, dtype=torch.bool, device=self.device), envs)
        dev = self.device
        groups = list(replay.obs)
        self.interventions += int((t["actor"] != keys.ACTOR_POLICY).sum())
        for i in range(b.steps):
            obs = {g: t[f"obs.{g}"][i].to(dev) for g in groups}
            nxt = {g: t[f"next_obs.{g}"][i].to(dev) for g in groups}
            reward, term, trunc = (t[k][i].to(dev) for k in ("reward", "terminated", "truncated"))
            replay.add(obs, t["action"][i].to(dev), reward, term, trunc, nxt, None, t["faulted"][i].to(dev),
                       t["actor"][i].to(dev))
            self.algo.observe(reward, term, trunc, envs)
            done = term | trunc
            info = {keys.EPISODE: {keys.EP_RETURN: t["ep_return"][i], keys.EP_LENGTH: t["ep_length"][i],
                                   keys.EP_SUCCESS: t["ep_success"][i]}}
            self.stats.add(info, t["ep_counted"][i] & done.cpu())  # the episodes the policy drove alone
        self.steps[b.actor_id] += b.steps
        self.stored[b.actor_id] = b.seq
        self.env_steps += b.steps * n
        if self.transitions >= self.algo.learning_starts:
            self.update_debt += self.algo.updates_per_step * b.steps

    def _allowance(self) -> list[int]:
        """Per slot, the vector steps its actor may have taken: what it sent plus the room left in
        ``max_lead_steps`` (the owed updates count against it), in quarters of the lead, so a held actor is
        released every lead/4 updates rather than after each one (each release is an RPC, and the learner's RPC
        threads share the interpreter with its training: per-update releases halved its update rate here)."""
        lead = self.settings.max_lead_steps
        if lead is None or self.transitions < self.algo.learning_starts:
            return [-1] * len(self.steps)
        q = max(1, lead // 4)
        room = max(0, lead - math.ceil(self.update_debt / self.algo.updates_per_step))
        return [s + room // q * q for s in self.steps]

    def run_iteration(self) -> dict[str, float]:
        """Until ``steps_per_iteration`` vector steps arrived (or 2 s passed): store what arrives, update while
        updates are owed, publish; then log."""
        start = time.perf_counter()
        algo, hub = self.algo, self.hub
        losses: dict[str, list[float | torch.Tensor]] = {}
        received, update_s, env_steps0 = 0, 0.0, self.env_steps
        while received < self.cfg.steps_per_iteration and time.perf_counter() - start < 2.0:
            for b in hub.drain():
                self._store(b)
                received += b.steps
            if self.update_debt >= 1.0:
                t0 = time.perf_counter()
                algo.train_mode()
                self.update_debt -= 1.0
                offline = self._with_interventions if self.interventions else self.demo
                for k, v in algo.update(self.sampler, offline).items():
                    losses.setdefault(k, []).append(v)
                self.updates += 1
                if self.updates == 1 or self.updates % self.settings.publish_every == 0:
                    hub.publish(self.publisher.blob(algo.policy, hub.version + 1))
                update_s += time.perf_counter() - t0
            else:
                hub.arrived.wait(0.01)
            hub.set_allowed(self._allowance())
        self.iteration += 1
        dt = time.perf_counter() - start
        self.elapsed_s += dt
        scalars = mean_stats(losses)
        summary = self.episode_summary()
        scalars.update(summary)
        scalars.update(hub.counters())
        steps = self.env_steps - env_steps0
        scalars.update({"perf/fps": steps / dt, "perf/update_fraction": update_s / dt, "perf/updates": self.updates,
                        "perf/update_debt": self.update_debt, "perf/iteration": self.iteration,
                        "replay/transitions": self.transitions, "replay/interventions": self.interventions})
        self.logger.scalars(self.env_steps, scalars)
        ret, succ = summary.get("episode/return"), summary.get("episode/success_rate")
        self.logger.progress(steps, ret, succ)
        self.logger.curve_point({"iteration": self.iteration, "env_steps": self.env_steps, "wall_s": self.elapsed_s,
                                 "sim_s": 0.0, "success_rate": succ, "mean_return": ret,
                                 "updates": self.updates})
        return scalars

    # ------------------------------------------------------------------------------------------- state
    def save(self) -> None:
        """Checkpoint now, unless nothing arrived and nothing was learned since the last one (a learner waiting for
        its actors); then the actors may forget every message it holds."""
        if self.saved == (self.stored, self.updates):
            return
        received = list(self.stored)  # not the hub's count: messages still queued are not in this checkpoint
        runner = {"iteration": self.iteration, "env_steps": self.env_steps, "elapsed_s": self.elapsed_s,
                  "update_debt": self.update_debt, "updates": self.updates, "stats": self.stats.state_dict(),
                  "remote": {"received": received, "steps": list(self.steps)},
                  "replays": [r.state_dict() for r in self.replays]}
        state = self.checkpoint_state(runner)
        if state is None or self.checkpoints is None:
            return
        self.checkpoints.save(self.iteration, state, {**self.meta, "env_steps": self.env_steps},
                              policy=self.algo.policy, score=self.episode_summary().get("episode/return"))
        self.hub.commit(received)
        self.saved = (received, self.updates)

    def restore(self, ckpt: Checkpoint) -> None:
        runner = self.restore_state(ckpt)
        self.iteration, self.env_steps, self.elapsed_s = runner["iteration"], runner["env_steps"], runner["elapsed_s"]
        self.update_debt, self.updates = float(runner["update_debt"]), int(runner["updates"])
        self.stats.load_state_dict(runner["stats"])
        remote = runner.get("remote")
        if remote is None or len(runner.get("replays", [])) != len(self.replays):
            raise ValueError(f"{ckpt.path} was not written by a remote learner of {len(self.replays)} actor slots "
                             "(remote.actors); resume it as it was started")
        for r, sd in zip(self.replays, runner["replays"], strict=True):
            r.load_state_dict(sd)
        self.interventions = sum(r.num_interventions for r in self.replays)
        self.steps = [int(x) for x in remote["steps"]]
        self.stored = [int(x) for x in remote["received"]]
        self.hub.restore(self.stored)
        self.saved = (list(self.stored), self.updates)
