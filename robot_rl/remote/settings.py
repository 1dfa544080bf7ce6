"""``remote.*``: the actor/learner split's settings, shared by ``robot-rl train`` (the learner) and ``robot-rl actor``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RemoteSettings:
    """An off-policy run split over processes or machines (DESIGN.md §7, RELIABILITY.md E1-E5).

    ``robot-rl train remote.listen=HOST:PORT remote.actors=K`` makes the run a learner that steps no env: K actor
    slots, each ``sim.num_envs`` envs of ``robot-rl actor remote.address=HOST:PORT remote.actor_id=i`` (on this
    machine, on sim hosts, or on a robot's computer), which act with the newest policy the learner published and
    send their transitions back. Timings: defaults from RELIABILITY.md E1-E2."""

    # learner
    listen: str | None = None  # HOST:PORT to serve actors on (port 0: any free one); set: this run is a learner
    actors: int = 1  # actor slots (remote.actor_id 0 .. actors - 1)
    # How stale the acting policy may get. FlashSAC so101_reach, 3 seeds (benchmarks/results/remote.json): a lead of 64
    # with a policy every 20 updates needed a median 84.5 k env steps to 90 % (1.55x one process's 54.5 k); 8 and 2,
    # 58.9 k (1.08x) in the same median wall-clock (109 s vs 110 s). Raise publish_every for large policies (a VLA).
    publish_every: int = 2  # gradient updates between published policies
    max_lead_steps: int | None = 8  # vector steps an actor may run ahead of what the learner has trained on, at
    # the algorithm's updates per step (null: actors never wait, as a real robot's time is worth more)
    # actor
    address: str | None = None  # the learner's HOST:PORT
    actor_id: int = 0  # this actor's slot
    steps_per_message: int = 4  # vector steps per message
    # messages one Push may carry when a backlog waits (a bundle, up to max_message_mb / 4 in all): on a slow link
    # one message per round trip caps throughput (through a 0.5 s + 30 % loss link, about one message a second)
    max_messages_per_push: int = 32
    spool_dir: str | None = None  # where unsent transitions wait (default: runs/actor_<id>_spool)
    spool_max_messages: int = 10_000  # messages kept while the learner is away (the oldest dropped first)
    spool_max_mb: int = 1024  # ... and bytes
    heartbeat_s: float = 0.5  # a status call when there is nothing to push
    deadline_s: float = 2.0  # per call (a lost learner is detected within heartbeat_s + deadline_s)
    connect_timeout_s: float = 60.0  # an actor's first hello must succeed within this
    staleness_s: float = 60.0  # stop acting (safe hold) once the learner was last heard this long ago ...
    max_missed: int = 3  # ... or after this many failed calls in a row
    # both
    token_file: str | None = None  # the shared token (else $ROBOT_RL_TOKEN; a learner with neither writes one)
    max_message_mb: int = 64  # one message's size limit (same on both ends)
    tls_cert: str | None = None  # learner: PEM certificate chain (with tls_key) to serve over TLS
    tls_key: str | None = None
    tls_ca: str | None = None  # actor: PEM root certificate to check the learner's

    def __post_init__(self) -> None:
        for name in ("actors", "publish_every", "steps_per_message", "spool_max_messages", "spool_max_mb",
                     "max_missed", "max_message_mb", "max_messages_per_push"):
            if getattr(self, name) < 1:
                raise ValueError(f"remote.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_lead_steps is not None and self.max_lead_steps < 1:
            raise ValueError(f"remote.max_lead_steps must be >= 1 or null, got {self.max_lead_steps}")
        for name in ("heartbeat_s", "deadline_s", "connect_timeout_s", "staleness_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"remote.{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.actor_id < 1 << 20:
            raise ValueError(f"remote.actor_id must be >= 0, got {self.actor_id}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("remote.tls_cert and remote.tls_key go together")
