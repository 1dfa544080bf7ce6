"""An actor of an actor/learner split: steps its envs with the newest policy the learner published, sends back what
happened, and holds safely when the learner is gone (RELIABILITY.md E1).

The control loop runs here; the network on ``ActorLink``'s thread. Until the learner publishes a policy the actor
explores with uniform random actions (the learner's warm-up); after, with FlashSAC's held exploration noise
(``explore``). Every ``steps_per_message`` vector steps become one numbered message in the spool.

Safe hold: once the learner has not answered for ``staleness_s`` or ``max_missed`` calls in a row, the actor stops
acting (a simulated env is not stepped; on a robot no new action is sent, so the arm holds its last goal) until the
learner answers again. It also waits (without stepping) while it is ``max_lead_steps`` ahead of the training.
"""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load

from policies import keys, load_policy
from policies.persistence import PROCESSOR_PREFIX, WEIGHTS_FILE, PolicyFileError, check_weights
from policies.safetensors_check import MalformedFileError, check_safetensors
from robot_rl.algos.flashsac import RepeatedNoise, explore
from robot_rl.env import VecEnv, episode_mask
from robot_rl.remote import wire
from robot_rl.remote.auth import read_token
from robot_rl.remote.link import ActorLink, RemoteRefused
from robot_rl.remote.service import LearnerClient
from robot_rl.remote.settings import RemoteSettings
from robot_rl.remote.spool import Spool


@dataclass
class ActorReport:
    """What one actor did (``robot-rl actor`` prints it as JSON)."""

    vector_steps: int = 0
    env_steps: int = 0
    messages: int = 0
    policies: int = 0  # policies received and loaded
    hold_s: float = 0.0  # time in safe hold (the learner lost)
    wait_s: float = 0.0  # time waiting for the learner to train (max_lead_steps)
    holds: int = 0  # times the actor entered safe hold
    reconnects: int = 0
    chunk_errors: int = 0
    dropped: int = 0  # messages the spool dropped over its limits
    detect_s: list[float] = field(default_factory=list)  # learner lost -> detected, per loss
    stopped_by_learner: bool = False
    intervention_steps: int = 0  # env steps a person (hil.person) drove instead of the policy
    # the control loop's ticks (a policy action, the env step, the message to the spool), in ms: p50 / p99 / max;
    # the network's calls run on another thread (RELIABILITY.md E4: p99 <= 40 ms whatever the network does)
    tick_ms: dict[str, float] = field(default_factory=dict)
    hil: dict[str, float] = field(default_factory=dict)  # the intervention agent's report (hil.person), else empty


def _load_blob(blob: bytes, folder: Path, current: Any = None) -> Any:
    """A published policy (a wire folder): when ``current`` is a policy of the same config and processor, its new
    weights loaded into it (checked name by name, shape by shape); otherwise the folder written into ``folder`` and
    loaded with every check of ``load_policy`` (~90 ms for FlashSAC's actor, against ~2 ms for the weights alone)."""
    _, files = wire.unpack_folder(blob)
    same = current is not None and all(
        (folder / name).is_file() and (folder / name).read_bytes() == files.get(name)
        for name in files if name != WEIGHTS_FILE)
    if same:
        data = files.get(WEIGHTS_FILE, b"")
        try:
            check_safetensors(data, "<published policy>")
            weights = st_load(data)
        except MalformedFileError as e:
            raise PolicyFileError("<published policy>", e.problem) from None
        expected = {k: v for k, v in current.state_dict().items() if not k.startswith(PROCESSOR_PREFIX)}
        check_weights(expected, weights, "<published policy>")
        current.load_state_dict(weights, strict=False)
        return current
    folder.mkdir(parents=True, exist_ok=True)
    for p in folder.iterdir():
        p.unlink()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return load_policy(folder)


def run_actor(env: VecEnv, settings: RemoteSettings, task: str, seed: int = 0, max_steps: int | None = None,
              hil: Any = None, shape: Callable[[VecEnv, float | None], VecEnv] | None = None) -> ActorReport:
    """Act for the learner at ``settings.address`` until it says stop (or ``max_steps`` vector steps). ``hil``: an
    intervention agent (``robot_rl.hil.InterventionAgent``; HIL-SERL's person is where the envs are): it may take
    over any env; the transitions say who acted, and only the episodes the policy drove alone count toward the
    learner's success rate and stop rule. ``shape(env, gamma)``: the env with dense rewards at the learner's
    discount ``gamma`` (``reward.progress``; applied once connected, when the learner has told its discount).

    Raises:
        RemoteRefused: the learner refused this actor (bad token, another task or env size, a malformed answer).
        TimeoutError: no learner answered within ``connect_timeout_s``.
    """
    s = settings
    if s.address is None:
        raise ValueError("robot-rl actor needs remote.address=HOST:PORT (the learner's remote.listen)")
    token = read_token(s.token_file)
    if token is None:
        raise ValueError("no token: pass remote.token_file=<the learner's run folder>/remote_token or set "
                         "$ROBOT_RL_TOKEN")
    tls_ca = Path(s.tls_ca).read_bytes() if s.tls_ca else None
    client = LearnerClient(s.address, token, s.max_message_mb * 2**20, tls_ca)
    spool = Spool(Path(s.spool_dir or f"runs/actor_{s.actor_id}_spool"), s.spool_max_messages,
                  s.spool_max_mb * 2**20)
    shapes = {g: list(shape) for g, shape in env.obs_spec.shapes.items()}
    hello = {"actor_id": s.actor_id, "task": task, "num_envs": env.num_envs, "action_dim": env.action_dim,
             "obs_shapes": shapes, "session": secrets.token_hex(8), "shaped": shape is not None}
    link = ActorLink(client, hello, spool, s.heartbeat_s, s.deadline_s, s.max_messages_per_push,
                     s.max_message_mb * 2**20 // 4)
    link.start()
    report = ActorReport()
    ticks: list[float] = []  # seconds per control tick
    try:
        _act(env, s, link, spool, seed, max_steps, report, ticks, hil, shape)
    finally:
        if ticks:
            t = torch.tensor(ticks, dtype=torch.float64) * 1e3
            report.tick_ms = {"p50": round(float(t.quantile(0.5)), 2), "p99": round(float(t.quantile(0.99)), 2),
                              "max": round(float(t.max()), 2), "count": len(ticks)}
        if hil is not None:
            report.hil = hil.report()
        st = link.snapshot()
        link.close(flush_s=5.0 if st.stop and not st.refused else 0.0)
        st = link.snapshot()
        report.reconnects, report.chunk_errors, report.dropped = st.reconnects, st.chunk_errors, spool.dropped
    return report


def _act(env: VecEnv, s: RemoteSettings, link: ActorLink, spool: Spool, seed: int, max_steps: int | None,
         report: ActorReport, ticks: list[float], hil: Any = None,
         shape: Callable[[VecEnv, float | None], VecEnv] | None = None) -> None:
    deadline = time.monotonic() + s.connect_timeout_s
    while not link.snapshot().connected:
        st = link.snapshot()
        if st.refused:
            raise RemoteRefused(f"the learner at {s.address} refused actor {s.actor_id}: {st.refused}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no learner answered at {s.address} within {s.connect_timeout_s} s "
                               "(remote.connect_timeout_s)")
        time.sleep(0.05)
    groups = link.groups
    if 0 <= link.max_lead_steps < s.steps_per_message:  # it would wait for an allowance its own message withholds
        raise ValueError(f"remote.steps_per_message={s.steps_per_message} is more than the learner lets an actor run "
                         f"ahead (remote.max_lead_steps={link.max_lead_steps}): send at most that many per message")
    print(f"actor {s.actor_id}: connected to the learner at {s.address}", file=sys.stderr)
    if shape is not None:  # dense rewards at the learner's discount
        env = shape(env, link.gamma)
    n, a = env.num_envs, env.action_dim
    noise = RepeatedNoise(n, a, link.exploration.get("zeta_s", 2.0), int(link.exploration.get("max_repeat", 16)),
                          torch.device("cpu"))
    seq = max(spool.last_seq, link.received) + 1
    folder = Path(tempfile.mkdtemp(prefix=f"robot_rl_actor_{s.actor_id}_"))  # the policy being run
    try:
        _loop(env, s, link, spool, seed, max_steps, report, ticks, groups, noise, seq, folder, hil)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _loop(env: VecEnv, s: RemoteSettings, link: ActorLink, spool: Spool, seed: int, max_steps: int | None,
          report: ActorReport, ticks: list[float], groups: list[str], noise: RepeatedNoise, seq: int, folder: Path,
          hil: Any) -> None:
    n, a = env.num_envs, env.action_dim
    policy: Any = None
    obs, _ = env.reset(seed=seed)
    pending: list[dict[str, torch.Tensor]] = []
    holding, lost_seen = False, 0.0
    while max_steps is None or report.vector_steps < max_steps:
        st = link.snapshot()
        if st.refused:
            raise RemoteRefused(f"the learner at {s.address} refused actor {s.actor_id}: {st.refused}")
        if st.stop:
            report.stopped_by_learner = True
            break
        if st.lost_at and st.lost_at != lost_seen:  # the learner was lost: how long it took to notice
            lost_seen = st.lost_at
            report.detect_s.append(max(0.0, st.lost_at - st.last_heard))
        new = link.take_policy()
        if new is not None:
            policy = _load_blob(new[1], folder, policy)
            report.policies += 1
        stale = st.missed >= s.max_missed or (st.last_heard and time.monotonic() - st.last_heard > s.staleness_s)
        if stale:  # safe hold: no env step, no action sent, until the learner answers again
            if not holding:
                holding = True
                report.holds += 1
                print(f"actor {s.actor_id}: learner lost ({st.missed} calls failed); holding", file=sys.stderr)
            t0 = time.monotonic()
            link.wait_change(0.05)
            report.hold_s += time.monotonic() - t0
            continue
        if holding:
            holding = False
            print(f"actor {s.actor_id}: learner back; acting again", file=sys.stderr)
        if 0 <= st.allowed <= report.vector_steps:  # ahead of the training: wait for it
            t0 = time.monotonic()
            link.held(report.vector_steps)
            link.wait_change(0.05)
            report.wait_s += time.monotonic() - t0
            continue
        link.held(-1)
        tick = time.perf_counter()
        with torch.no_grad():
            if policy is None:
                action = torch.rand(n, a) * 2.0 - 1.0
            else:
                mean, log_std = policy(obs)
                action = explore(mean, log_std, noise())
        actor = None
        if hil is not None:  # the person watching these envs may take over (their action is what gets applied)
            action, actor = hil(obs, action)
            report.intervention_steps += int((actor != keys.ACTOR_POLICY).sum())
        next_obs, reward, terminated, truncated, info = env.step(action) if actor is None else env.step(
            action, actor=actor)
        done = episode_mask(terminated, truncated)
        noise.reset(done)
        ep = info.get(keys.EPISODE, {})
        counted = done if hil is None else hil.alone(done)  # a person's help never counts as the policy's success
        if hil is not None:
            hil.end(done, ep.get(keys.EP_SUCCESS))
        applied = info.get(keys.APPLIED_ACTION)
        final = info[keys.FINAL_OBS]
        step = {"action": (action if applied is None else applied).float().cpu(),
                "reward": reward.float().cpu(), "terminated": terminated.cpu(), "truncated": truncated.cpu(),
                "faulted": info.get(keys.FAULTED, torch.zeros(n, dtype=torch.bool)).cpu(),
                "actor": info.get(keys.ACTOR, torch.zeros(n, dtype=torch.long)).long().cpu(),
                "ep_counted": counted.to(torch.bool).cpu()}
        for k, key in (("ep_return", keys.EP_RETURN), ("ep_length", keys.EP_LENGTH), ("ep_success", keys.EP_SUCCESS)):
            step[k] = torch.where(done, ep[key].float(), 0.0).cpu() if key in ep else torch.zeros(n)
        for g in groups:
            step[f"obs.{g}"] = obs[g].cpu()
            nxt = next_obs[g]
            step[f"next_obs.{g}"] = torch.where(done.view(-1, *([1] * (nxt.dim() - 1))), final[g], nxt).cpu()
        pending.append({k: v.to("cpu", copy=True) for k, v in step.items()})  # the env may reuse its buffers
        obs = next_obs
        report.vector_steps += 1
        report.env_steps += n
        if len(pending) == s.steps_per_message:
            tensors = {k: torch.stack([p[k] for p in pending]) for k in pending[0]}
            spool.put(seq, wire.encode({"kind": "transitions", "actor_id": s.actor_id, "seq": seq,
                                        "steps": len(pending), "session": link.hello_header["session"]},
                                       tensors, max_bytes=s.max_message_mb * 2**20))
            seq += 1
            report.messages += 1
            pending = []
            link.notify()
        ticks.append(time.perf_counter() - tick)
