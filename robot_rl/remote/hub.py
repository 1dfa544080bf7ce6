"""The learner's side of the protocol: what the RPC threads and the training loop share, behind one lock.

RPC threads (``robot_rl.remote.service``) validate each actor's messages and queue them; the runner
(``robot_rl.remote.learner``) drains the queue into its replay buffers, trains, publishes new weights, sets each
actor's allowance and marks what its checkpoints hold as committed. Nothing here trains or blocks on training.

Per actor slot (``actor_id`` in ``0 .. actors - 1``) the hub keeps the last sequence number received, the last one
inside a checkpoint (``committed``) and the vector steps the actor may have taken (``allowed``; -1 = no limit). A message at or below ``received`` is a duplicate (acknowledged, not stored); one
past a gap is stored and the gap counted as lost.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from robot_rl.remote import wire
from robot_rl.remote.wire import Busy, WireError

LONG_POLL_S = 0.5  # the longest a held actor's status call waits for its allowance (< any sane deadline_s)


@dataclass
class Slot:
    """One actor slot's stream."""

    received: int = -1  # last sequence number stored
    committed: int = -1  # last sequence number a checkpoint holds
    allowed: int = -1  # vector steps the actor may have taken (-1: no limit)
    session: str = ""  # the actor process's id: a new one means new envs (the runner cuts its episodes)
    new_session: bool = False  # a new session said hello; its first stored message says so
    last_seen: float = 0.0
    duplicates: int = 0
    lost: int = 0
    hellos: int = 0
    told_stop: bool = False  # an answer since the learner stopped has reached it


@dataclass
class Spec:
    """What every actor must match: the task, its envs and the observation groups the learner stores."""

    task: str
    num_envs: int
    action_dim: int
    obs_shapes: dict[str, tuple[int, ...]]
    obs_dtypes: dict[str, torch.dtype]
    exploration: dict[str, float] = field(default_factory=dict)  # the actors' exploration noise settings
    max_lead_steps: int = -1  # how far an actor may run ahead (-1: no limit); its messages must be shorter
    gamma: float | None = None  # the learner's discount: an actor shaping its rewards (reward.progress) uses it
    demos: bool = False  # the learner mixes demos (unshaped rewards) into its batches: shaping actors are refused


@dataclass
class Batch:
    """A validated message of ``steps`` vector steps from one actor (tensors [S, N, ...])."""

    actor_id: int
    seq: int
    steps: int
    new_session: bool
    tensors: dict[str, torch.Tensor] = field(repr=False)


class LearnerHub:
    """Shared state between the learner's RPC threads and its training loop.

    Args:
        spec: what actors must match.
        actors: actor slots.
        max_queued_steps: vector steps queued but not yet drained before pushes are refused (RESOURCE limit).
    """

    def __init__(self, spec: Spec, actors: int, max_queued_steps: int = 100_000) -> None:
        self.spec, self.actors = spec, actors
        self.session = secrets.token_hex(8)  # this learner process: an actor seeing a new one re-handshakes
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # an allowance grew, or the learner stops
        self.arrived = threading.Event()
        self.slots = [Slot() for _ in range(actors)]
        self.queue: deque[Batch] = deque()
        self.queued_steps, self.max_queued_steps = 0, max_queued_steps
        self.version, self.weights = 0, b""  # the newest exported policy (a wire folder) and its version
        self.stop = False

    # ------------------------------------------------------------------------------------------- RPC side
    def _ack(self, slot: Slot, kind: str = "ack") -> bytes:
        slot.told_stop = slot.told_stop or self.stop
        header = {"kind": kind, "session": self.session, "received": slot.received, "committed": slot.committed,
                  "allowed": slot.allowed, "version": self.version, "stop": self.stop}
        if kind == "welcome":
            header.update(groups=sorted(self.spec.obs_shapes), exploration=self.spec.exploration,
                          max_lead_steps=self.spec.max_lead_steps, gamma=self.spec.gamma)
        return wire.encode(header)

    def _slot(self, header: dict[str, Any]) -> tuple[int, Slot]:
        a = wire.field(header, "actor_id", int)
        if not 0 <= a < self.actors:
            raise WireError(f"actor_id {a} is not a slot of this learner (remote.actors={self.actors}: 0.."
                            f"{self.actors - 1})")
        return a, self.slots[a]

    def hello(self, request: bytes) -> bytes:
        """An actor (re)joins: refused unless its task, envs, action size and observation groups match."""
        header, _ = wire.decode(request, "hello")
        a, slot = self._slot(header)
        s = self.spec
        theirs = {"task": header.get("task"), "num_envs": header.get("num_envs"),
                  "action_dim": header.get("action_dim"),
                  "obs_shapes": {k: tuple(v) for k, v in (header.get("obs_shapes") or {}).items()
                                 if k in s.obs_shapes and isinstance(v, list)}}
        ours = {"task": s.task, "num_envs": s.num_envs, "action_dim": s.action_dim, "obs_shapes": s.obs_shapes}
        for k, want in ours.items():
            if theirs[k] != want:
                raise WireError(f"actor {a} does not fit this learner: its {k} is {theirs[k]}, the learner's "
                                f"{want} (start the actor with the learner's task and sim.num_envs)")
        if header.get("shaped") and s.demos:
            raise WireError(f"actor {a} shapes its rewards (reward.progress) and this learner mixes demos whose "
                            "rewards are not shaped (demo_dataset.root): the two would teach different returns; "
                            "use one of them")
        session = wire.field(header, "session", str)
        with self.lock:
            slot.hellos += 1
            slot.last_seen = time.monotonic()
            if session != slot.session:
                slot.session, slot.new_session = session, True
            reply = self._ack(slot, "welcome")
        return reply

    def push(self, request: bytes) -> bytes:
        """One message of transitions, or a bundle of them (in order): each checked, queued (unless a duplicate);
        acknowledged after the last."""
        header, tensors = wire.decode(request)
        if header.get("kind") == "bundle":
            ack = b""
            for message in wire.unbundle(header, tensors):
                ack = self._push(*wire.decode(message, "transitions"))
            return ack
        if header.get("kind") != "transitions":
            raise WireError(f"expected a 'transitions' or 'bundle' message, got {str(header.get('kind'))[:40]!r}")
        return self._push(header, tensors)

    def _push(self, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> bytes:
        a, slot = self._slot(header)
        seq, steps = wire.field(header, "seq", int), wire.field(header, "steps", int)
        if wire.field(header, "session", str) != slot.session:
            raise WireError(f"actor {a}: a push from actor process {header.get('session')!r}, but the slot belongs "
                            f"to {slot.session or 'nobody'!r} (another actor said hello on it since, or this one never "
                            "did): one actor process per remote.actor_id")
        self._check(a, steps, tensors)
        with self.lock:
            slot.last_seen = time.monotonic()
            if seq <= slot.received:
                slot.duplicates += 1
            else:
                if self.queued_steps + steps > self.max_queued_steps:
                    raise Busy(f"learner queue full ({self.queued_steps} vector steps waiting): retry later")
                slot.lost += seq - slot.received - 1
                slot.received = seq
                self.queue.append(Batch(a, seq, steps, slot.new_session, tensors))
                slot.new_session = False
                self.queued_steps += steps
                self.arrived.set()
            return self._ack(slot)

    def status(self, request: bytes) -> bytes:
        """A heartbeat; with ``wait_above`` (an actor held by its allowance), answered once the allowance is above
        it, the learner stops, or after ``LONG_POLL_S`` (one call per change instead of polling)."""
        header, _ = wire.decode(request, "status")
        _, slot = self._slot(header)
        above = header.get("wait_above")
        with self.lock:
            if isinstance(above, int) and not isinstance(above, bool):
                self.changed.wait_for(lambda: not 0 <= slot.allowed <= above or self.stop, timeout=LONG_POLL_S)
            slot.last_seen = time.monotonic()
            return self._ack(slot)

    def parameters(self, request: bytes) -> Iterator[bytes]:
        """The newest policy in chunks (none when the actor already has this version)."""
        header, _ = wire.decode(request, "pull")
        have = wire.field(header, "version", int)
        with self.lock:
            version, blob, session = self.version, self.weights, self.session
        if version == 0 or (have == version and header.get("session") == session):
            return iter(())
        return wire.split_blob(blob, {"version": version, "session": session})

    def handlers(self) -> dict[str, Any]:
        return {"Hello": self.hello, "Push": self.push, "Status": self.status, "Parameters": self.parameters}

    def _check(self, a: int, steps: int, t: dict[str, torch.Tensor]) -> None:
        """Shapes and dtypes of a transitions message ([S, N, ...]); finite values are the learner's guard's job."""
        s, n = self.spec, self.spec.num_envs
        if not 1 <= steps <= 4096:
            raise WireError(f"actor {a}: {steps} steps in one message (1..4096)")
        want: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {
            "action": ((steps, n, s.action_dim), torch.float32), "reward": ((steps, n), torch.float32),
            "terminated": ((steps, n), torch.bool), "truncated": ((steps, n), torch.bool),
            "faulted": ((steps, n), torch.bool), "actor": ((steps, n), torch.int64),
            "ep_return": ((steps, n), torch.float32), "ep_length": ((steps, n), torch.float32),
            "ep_success": ((steps, n), torch.float32), "ep_counted": ((steps, n), torch.bool)}
        for g, shape in s.obs_shapes.items():
            want[f"obs.{g}"] = ((steps, n, *shape), s.obs_dtypes[g])
            want[f"next_obs.{g}"] = ((steps, n, *shape), s.obs_dtypes[g])
        if set(t) != set(want):
            missing, extra = sorted(set(want) - set(t)), sorted(set(t) - set(want))
            raise WireError(f"actor {a}: transitions message fields differ: missing {missing}, unexpected {extra}")
        for k, (shape, dtype) in want.items():
            if tuple(t[k].shape) != shape or t[k].dtype != dtype:
                raise WireError(f"actor {a}: field {k!r} is {t[k].dtype} {list(t[k].shape)}, expected {dtype} "
                                f"{list(shape)}")

    # --------------------------------------------------------------------------------------- runner side
    def drain(self) -> list[Batch]:
        with self.lock:
            out = list(self.queue)
            self.queue.clear()
            self.queued_steps = 0
            self.arrived.clear()
        return out

    def publish(self, blob: bytes) -> None:
        with self.lock:
            self.version += 1
            self.weights = blob

    def commit(self, received: list[int]) -> None:
        """A checkpoint now holds every message up to ``received[a]`` of each slot: actors may forget them."""
        with self.lock:
            for slot, r in zip(self.slots, received, strict=True):
                slot.committed = r

    def set_allowed(self, allowed: list[int]) -> None:
        with self.lock:
            grew = False
            for slot, n in zip(self.slots, allowed, strict=True):
                grew |= n != slot.allowed
                slot.allowed = n
            if grew:
                self.changed.notify_all()

    def set_stop(self) -> None:
        """From now on every answer tells the actors to stop (held ones at once)."""
        with self.lock:
            self.stop = True
            self.changed.notify_all()

    def restore(self, received: list[int]) -> None:
        """A resumed learner: each slot continues after what its checkpoint holds (``received``: the last message
        stored in it, per slot)."""
        with self.lock:
            for slot, r in zip(self.slots, received, strict=True):
                slot.received = slot.committed = r

    def all_told(self) -> bool:
        """Every actor that ever said hello has had an answer since ``stop`` was set (or is gone 5 s)."""
        with self.lock:
            now = time.monotonic()
            return all(s.told_stop or now - s.last_seen > 5.0 for s in self.slots if s.hellos)

    def counters(self) -> dict[str, float]:
        with self.lock:
            now = time.monotonic()
            out = {"remote/duplicates": float(sum(s.duplicates for s in self.slots)),
                   "remote/lost": float(sum(s.lost for s in self.slots)),
                   "remote/hellos": float(sum(s.hellos for s in self.slots)),
                   "remote/version": float(self.version)}
            seen = [now - s.last_seen for s in self.slots if s.hellos]
            out["remote/actors_seen_5s"] = float(sum(x < 5.0 for x in seen))
        return out
