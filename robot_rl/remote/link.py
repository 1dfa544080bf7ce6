"""An actor's connection to the learner, on its own thread: the control loop never waits on the network.

The loop hands finished messages to the spool (``robot_rl.remote.spool``) and reads the link's state (the newest
policy, whether the learner was heard lately, how far it may run ahead, whether to stop). The thread says hello
(and again whenever the learner's session changes: a restarted learner), pushes spooled messages in sequence order
from the first the learner lacks, forgets those it reports committed, sends a status call when there is nothing to
push (the heartbeat), and pulls the policy in checked chunks when a newer one is published. A failed call marks the
learner lost (``missed`` counts them); the thread retries with backoff for as long as the actor runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc

from robot_rl.remote import wire
from robot_rl.remote.service import LearnerClient
from robot_rl.remote.spool import Spool
from robot_rl.remote.wire import ChunkError, WireError

PULL_DEADLINE_S = 300.0  # a whole policy transfer (1 GiB took 8.9 s on localhost; a slow link needs more)


class RemoteRefused(ValueError):
    """The learner refused this actor for good (bad token, another task or env size): retrying cannot help."""


@dataclass
class LinkState:
    """What the control loop reads (a snapshot under the lock)."""

    connected: bool = False
    last_heard: float = 0.0  # time.monotonic() of the last answered call (0: never)
    missed: int = 0  # failed calls in a row
    allowed: int = -1  # vector steps the actor may have taken (-1: no limit)
    stop: bool = False
    refused: str = ""  # why the learner refused this actor (fatal)
    version: int = 0  # the newest policy received
    reconnects: int = 0  # hellos after the first
    chunk_errors: int = 0  # parameter transfers retried after a bad chunk
    lost_at: float = 0.0  # when the learner was first missed (0: not lost)


class ActorLink:
    """The network thread of one actor.

    Args:
        client: the learner's RPC client.
        hello: the hello message's header (actor_id, task, num_envs, action_dim, obs_shapes, session).
        spool: where outgoing messages wait.
        heartbeat_s, deadline_s: see ``RemoteSettings``.
    """

    def __init__(self, client: LearnerClient, hello: dict[str, Any], spool: Spool, heartbeat_s: float,
                 deadline_s: float, max_per_push: int = 1, max_push_bytes: int = wire.MAX_MESSAGE_BYTES // 4) -> None:
        self.client, self.hello_header, self.spool = client, hello, spool
        self.max_per_push, self.max_push_bytes = max(1, max_per_push), max_push_bytes
        self.heartbeat_s, self.deadline_s = heartbeat_s, deadline_s
        self.lock = threading.Lock()
        self.wake = threading.Event()  # the loop has something for the thread (a message, a new hold)
        self.changed = threading.Event()  # the thread has something for the loop (allowance, stop, loss, policy)
        self.state = LinkState()
        self.session = ""  # the learner's
        self.received = -1  # the learner's last stored message of ours
        self.blob: bytes | None = None  # the newest policy folder not yet taken by the loop
        self.closing = False
        self.wait_above = -1  # >= 0: the loop is held at this many steps by its allowance (status long-polls)
        self.groups: list[str] = []  # observation groups the learner stores (from its welcome)
        self.exploration: dict[str, float] = {}  # the learner's exploration-noise settings
        self.gamma: float | None = None  # the learner's discount (for reward shaping on the actor)
        self.max_lead_steps = -1  # the learner's remote.max_lead_steps (-1: none)
        self.thread = threading.Thread(target=self._run, name="actor-link", daemon=True)

    # ---------------------------------------------------------------------------------------- loop side
    def start(self) -> None:
        self.thread.start()

    def snapshot(self) -> LinkState:
        with self.lock:
            return LinkState(**vars(self.state))

    def take_policy(self) -> tuple[int, bytes] | None:
        """The newest policy folder (version, wire bytes) received since the last call, if any."""
        with self.lock:
            blob, self.blob = self.blob, None
            return None if blob is None else (self.state.version, blob)

    def notify(self) -> None:
        self.wake.set()

    def wait_change(self, timeout: float) -> None:
        """Block the loop until the thread has news for it (or ``timeout`` seconds): a held loop sleeps here instead
        of polling (polling every millisecond took a third of a core from the learner beside it)."""
        self.changed.wait(timeout)
        self.changed.clear()

    def held(self, steps: int) -> None:
        """The loop waits for an allowance above ``steps`` (-1: it does not wait): the next status call asks the
        learner to answer when there is one."""
        if steps != self.wait_above:
            self.wait_above = steps
            self.wake.set()

    def close(self, flush_s: float = 0.0) -> None:
        """Stop the thread, after up to ``flush_s`` seconds of pushing what is spooled."""
        deadline = time.monotonic() + flush_s
        while flush_s > 0 and time.monotonic() < deadline and self.spool.holds_after(self.received):
            if not self.snapshot().connected:
                break
            time.sleep(0.02)
        self.closing = True
        self.wake.set()
        self.thread.join(timeout=self.deadline_s + 5.0)
        self.client.close()

    # ---------------------------------------------------------------------------------------- thread side
    def _heard(self, reply: dict[str, Any]) -> None:
        with self.lock:
            st = self.state
            was = (st.connected, st.allowed, st.stop)
            st.connected, st.last_heard, st.missed, st.lost_at = True, time.monotonic(), 0, 0.0
            st.allowed, st.stop = int(reply.get("allowed", -1)), bool(reply.get("stop", False))
            if (st.connected, st.allowed, st.stop) != was:
                self.changed.set()
        self.received = max(self.received, int(reply.get("received", -1)))
        self.spool.release(int(reply.get("committed", -1)))

    def _missed(self) -> None:
        with self.lock:
            st = self.state
            st.connected, st.missed = False, st.missed + 1
            st.lost_at = st.lost_at or time.monotonic()
        self.changed.set()

    def _refuse(self, why: str) -> None:
        with self.lock:
            self.state.refused, self.state.stop = why, True
        self.closing = True
        self.changed.set()

    def _hello(self) -> None:
        reply, _ = wire.decode(self.client.call("Hello", wire.encode({"kind": "hello", **self.hello_header}),
                                                self.deadline_s), "welcome")
        if self.session:
            with self.lock:
                self.state.reconnects += 1
        self.groups = [str(g) for g in wire.field(reply, "groups", list)]
        self.exploration = dict(wire.field(reply, "exploration", dict))
        self.max_lead_steps = int(wire.field(reply, "max_lead_steps", int))
        gamma = reply.get("gamma")
        self.gamma = float(gamma) if isinstance(gamma, (int, float)) and not isinstance(gamma, bool) else None
        if reply["session"] != self.session:  # a new learner process: resend what it lacks, take its policy
            self.session, self.received = reply["session"], int(reply.get("received", -1))
            with self.lock:
                self.state.version = 0
        self._heard(reply)

    def _pull(self, want: int) -> None:
        if want <= self.state.version:
            return
        parts = wire.Reassembler()
        request = wire.encode({"kind": "pull", "version": self.state.version, "session": self.session})
        try:
            for chunk in self.client.stream("Parameters", request, PULL_DEADLINE_S):
                done = parts.add(chunk)
                if done is not None:
                    blob, header = done
                    with self.lock:
                        self.blob, self.state.version = blob, int(header["version"])
                    self.changed.set()
                    return
        except ChunkError:
            with self.lock:
                self.state.chunk_errors += 1  # asked again on the next round

    def _next_push(self) -> bytes | None:
        """The spool's oldest messages the learner lacks: one, or a bundle of up to ``max_per_push`` (within
        ``max_push_bytes``) when a backlog waits."""
        messages = [m for _, m in self.spool.after(self.received, self.max_per_push, self.max_push_bytes)]
        if len(messages) <= 1:
            return messages[0] if messages else None
        return wire.bundle(messages, max_bytes=2 * self.max_push_bytes)

    def _run(self) -> None:
        backoff = 0.1
        actor_id = self.hello_header["actor_id"]
        polled = -1  # the held step count last long-polled for (not asked again until the loop moves on)
        while not self.closing:
            try:
                if not self.state.connected:
                    self._hello()
                    backoff = 0.1
                nxt = self._next_push()
                if nxt is not None:
                    reply, _ = wire.decode(self.client.call("Push", nxt, self.deadline_s), "ack")
                else:
                    held = self.wait_above if self.wait_above != polled else -1
                    request = {"kind": "status", "actor_id": actor_id, **({"wait_above": held} if held >= 0 else {})}
                    polled = max(polled, held)
                    reply, _ = wire.decode(self.client.call("Status", wire.encode(request), self.deadline_s), "ack")
                if reply["session"] != self.session:  # the learner restarted between our calls
                    self._missed()
                    continue
                self._heard(reply)
                self._pull(int(reply.get("version", 0)))
                if nxt is None and not self.state.stop and self.wait_above in (-1, polled):
                    self.wake.wait(self.heartbeat_s)
                    self.wake.clear()
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT):
                    self._refuse(f"{code.name}: {e.details()}")
                    return
                self._missed()
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            except (WireError, KeyError, TypeError, ValueError) as e:  # a malformed answer: the peer is not ours
                self._refuse(f"malformed answer from the learner: {e}")
                return
