"""The actor/learner wire (RELIABILITY.md E3, E5): messages, chunked blobs, the spool, the token, hostile bytes.

Everything here runs in this process over real gRPC on localhost; nothing is mocked except, where named, a network
that corrupts one chunk in transit.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import time
from pathlib import Path

import grpc
import pytest
import torch

from robot_rl.remote import wire
from robot_rl.remote.auth import TokenCheck, make_token, read_token
from robot_rl.remote.hub import LearnerHub, Spec
from robot_rl.remote.link import ActorLink
from robot_rl.remote.service import LearnerClient, serve
from robot_rl.remote.spool import Spool
from robot_rl.remote.wire import ChunkError, MessageTooLarge, Reassembler, WireError

TOKEN = "test-token"


def test_message_round_trip_keeps_tensors_and_header():
    t = {"obs.policy": torch.randn(4, 3, 7), "terminated": torch.tensor([[True, False, True]] * 4),
         "image": torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8)}
    header, got = wire.decode(wire.encode({"kind": "transitions", "seq": 5}, t), "transitions")
    assert header == {"wire": wire.WIRE_VERSION, "kind": "transitions", "seq": 5}
    assert set(got) == set(t) and all(torch.equal(got[k], t[k]) and got[k].dtype == t[k].dtype for k in t)


def test_decode_refuses_the_wrong_kind_and_missing_fields():
    data = wire.encode({"kind": "status", "actor_id": 0})
    with pytest.raises(WireError, match="expected a 'hello' message, got 'status'"):
        wire.decode(data, "hello")
    header, _ = wire.decode(data)
    with pytest.raises(WireError, match="field 'seq' is NoneType, not int"):
        wire.field(header, "seq", int)
    with pytest.raises(WireError, match="field 'actor_id' is bool"):
        wire.field({"kind": "x", "actor_id": True}, "actor_id", int)


def test_oversize_message_is_refused_before_sending_with_what_to_change():
    with pytest.raises(MessageTooLarge, match=r"over the limit of 1,000 bytes \(remote.max_message_mb\).*steps_per_message"):
        wire.encode({"kind": "transitions"}, {"x": torch.zeros(1000)}, max_bytes=1000)
    with pytest.raises(MessageTooLarge):
        wire.decode(b"\0" * 2000, max_bytes=1000)


def _blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def test_chunked_blob_reassembles_and_each_fault_is_a_typed_error():
    blob = _blob(10_000)
    chunks = list(wire.split_blob(blob, {"version": 3}, chunk_bytes=3000))
    assert len(chunks) == 4
    r = Reassembler()
    assert [r.add(c) for c in chunks[:3]] == [None, None, None]
    got, header = r.add(chunks[3])
    assert got == blob and header["version"] == 3 and header["size"] == 10_000
    # out of order, repeated, missing the start: refused, and the partial blob dropped (a clean retry works)
    for bad, match in (([chunks[0], chunks[2]], "chunk 2 of 4 arrived where chunk 1 was due"),
                       ([chunks[0], chunks[0]], "chunk 0 of 4 arrived where chunk 1 was due"),
                       ([chunks[1]], "chunk 1 of 4 arrived first")):
        r = Reassembler()
        with pytest.raises(ChunkError, match=match):
            for c in bad:
                r.add(c)
        assert r.first is None and r.parts == []
        assert [r.add(c) for c in chunks][-1][0] == blob
    # a flipped payload byte: the chunk's digest catches it
    corrupted = bytearray(chunks[1])
    corrupted[-10] ^= 0xFF
    r = Reassembler()
    r.add(chunks[0])
    with pytest.raises(ChunkError, match="chunk 1 of 4: its bytes do not match its SHA-256"):
        r.add(bytes(corrupted))
    # a chunk of another blob (another version) in the middle
    other = list(wire.split_blob(blob, {"version": 4}, chunk_bytes=3000))
    r = Reassembler()
    r.add(chunks[0])
    with pytest.raises(ChunkError, match="belongs to another blob"):
        r.add(other[1])
    # bytes that are not a message at all
    with pytest.raises(ChunkError, match="malformed message"):
        Reassembler().add(b"\x00" * 64)


def test_a_large_blob_crosses_grpc_in_chunks():
    """E3 at CI size (64 MiB, 16 chunks of 4 MiB; benchmarks/remote.py sends 1 GiB): the bytes arrive intact."""
    blob = os.urandom(64 * 2**20)
    hub = LearnerHub(Spec("t", 1, 1, {}, {}), 1)
    hub.publish(blob)
    server, port = serve(hub.handlers(), "127.0.0.1:0", TOKEN)
    try:
        client = LearnerClient(f"127.0.0.1:{port}", TOKEN)
        r = Reassembler()
        out = None
        for chunk in client.stream("Parameters", wire.encode({"kind": "pull", "version": 0}), 60.0):
            out = r.add(chunk) or out
        assert out is not None and hashlib.sha256(out[0]).digest() == hashlib.sha256(blob).digest()
        client.close()
    finally:
        server.stop(0)


def test_folder_pack_refuses_path_names():
    blob = wire.pack_folder({"config.json": b"{}", "model.safetensors": b"x"}, {"version": 1})
    _, files = wire.unpack_folder(blob)
    assert files == {"config.json": b"{}", "model.safetensors": b"x"}
    evil = wire.encode({"kind": "folder", "files": ["../escape"]}, {"file/../escape": torch.zeros(1, dtype=torch.uint8)})
    with pytest.raises(WireError, match="not a plain name"):
        wire.unpack_folder(evil)


# ---------------------------------------------------------------------------------------------------- spool
def test_spool_is_bounded_drops_oldest_and_survives_a_restart(tmp_path: Path):
    s = Spool(tmp_path, max_items=3, max_bytes=10**6)
    for i in range(5):
        s.put(i, bytes([i]) * 10)
    assert list(s.pending()) == [2, 3, 4] and s.dropped == 2 and s.last_seq == 4
    assert s.first_after(2) == (3, bytes([3]) * 10) and s.first_after(4) is None
    assert [q for q, _ in s.after(0, count=2)] == [2, 3] and [q for q, _ in s.after(0, 5, max_bytes=15)] == [2]
    assert s.holds_after(3) and not s.holds_after(4)
    with pytest.raises(ValueError, match="must increase"):
        s.put(4, b"x")
    s.release(3)
    assert list(s.pending()) == [4]
    (tmp_path / "0000000000000009.tmp").write_bytes(b"half")  # a write killed half-way
    again = Spool(tmp_path, max_items=3)
    assert list(again.pending()) == [4] and again.bytes == 10 and not list(tmp_path.glob("*.tmp"))
    by_bytes = Spool(tmp_path / "b", max_items=100, max_bytes=25)
    for i in range(4):
        by_bytes.put(i, b"x" * 10)
    assert list(by_bytes.pending()) == [2, 3] and by_bytes.dropped == 2


# ---------------------------------------------------------------------------------------------------- auth
@pytest.fixture
def served():
    spec = Spec("so101_reach", 2, 3, {"policy": (4,)}, {"policy": torch.float32})
    hub = LearnerHub(spec, actors=1)
    server, port = serve(hub.handlers(), "127.0.0.1:0", TOKEN)
    yield hub, port
    server.stop(0)


def _hello_header(**over) -> dict:
    return {"actor_id": 0, "task": "so101_reach", "num_envs": 2, "action_dim": 3, "obs_shapes": {"policy": [4]},
            "session": "a1", **over}


def _hello(**over) -> bytes:
    return wire.encode({"kind": "hello", **_hello_header(**over)})


def test_a_client_without_the_token_is_refused(served):
    _, port = served
    for token in ("wrong", "", TOKEN + "x"):
        client = LearnerClient(f"127.0.0.1:{port}", token)
        with pytest.raises(grpc.RpcError) as err:
            client.call("Hello", _hello(), 5.0)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            list(client.stream("Parameters", wire.encode({"kind": "pull", "version": 0}), 5.0))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        client.close()
    good = LearnerClient(f"127.0.0.1:{port}", TOKEN)
    header, _ = wire.decode(good.call("Hello", _hello(), 5.0), "welcome")
    assert header["groups"] == ["policy"] and header["received"] == -1
    good.close()


def test_an_actor_of_another_task_or_size_is_refused_naming_what_differs(served):
    _, port = served
    client = LearnerClient(f"127.0.0.1:{port}", TOKEN)
    for over, what in (({"task": "so101_lift"}, "its task is so101_lift, the learner's so101_reach"),
                       ({"num_envs": 4}, "its num_envs is 4"), ({"actor_id": 3}, "actor_id 3 is not a slot")):
        with pytest.raises(grpc.RpcError) as err:
            client.call("Hello", _hello(**over), 5.0)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and what in err.value.details()
    client.close()


def test_the_welcome_carries_the_discount_and_a_shaping_actor_is_refused_where_demos_are_mixed():
    """An actor shaping its rewards (reward.progress) learns the learner's discount from the welcome; a learner that
    mixes demos (unshaped rewards) refuses it, naming both settings."""
    spec = Spec("so101_reach", 2, 3, {"policy": (4,)}, {"policy": torch.float32}, gamma=0.9)
    header, _ = wire.decode(LearnerHub(spec, actors=1).hello(_hello(shaped=True)), "welcome")
    assert header["gamma"] == 0.9
    with_demos = LearnerHub(Spec("so101_reach", 2, 3, {"policy": (4,)}, {"policy": torch.float32}, demos=True), 1)
    wire.decode(with_demos.hello(_hello(shaped=False)), "welcome")  # not shaping: welcome
    with pytest.raises(WireError, match=r"reward.progress.*demo_dataset.root"):
        with_demos.hello(_hello(shaped=True))


def test_token_file_and_environment(tmp_path: Path, monkeypatch):
    token = make_token(tmp_path)
    assert (tmp_path / "remote_token").stat().st_mode & 0o777 == 0o600
    assert read_token(str(tmp_path / "remote_token")) == token
    monkeypatch.setenv("ROBOT_RL_TOKEN", "from-env")
    assert read_token(None) == "from-env"
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_token(str(tmp_path / "missing"))
    assert isinstance(TokenCheck("x"), grpc.ServerInterceptor)


# ---------------------------------------------------------------------------------------------- hostile bytes
class _Boom:
    """Unpickling this creates the marker file (F1's test, over the wire)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_hostile_bytes_never_run_code_and_the_learner_stays_up(served, tmp_path: Path):
    """E5: pickles, truncated and bit-flipped messages, a huge declared header: INVALID_ARGUMENT, no marker file, and
    the learner still answers a good call after 300 of them."""
    _, port = served
    marker = tmp_path / "pwned"
    client = LearnerClient(f"127.0.0.1:{port}", TOKEN)
    client.call("Hello", _hello(), 5.0)
    good = wire.encode({"kind": "transitions", "actor_id": 0, "seq": 0, "steps": 1, "session": "a1"},
                       {"action": torch.zeros(1, 2, 3)})
    rng = random.Random(0)
    payloads = [pickle.dumps(_Boom(str(marker))), b"", b"\xff" * 8 + b"{}", (2**40).to_bytes(8, "little") + b"{}"]
    for _ in range(300):
        b = bytearray(rng.choice([good, _hello()]))
        kind = rng.randrange(3)
        if kind == 0:
            b = b[:rng.randrange(len(b))]
        elif kind == 1:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        else:
            b[8:8] = pickle.dumps(_Boom(str(marker)))
        payloads.append(bytes(b))
    codes = set()
    for p in payloads:
        for method in ("Push", "Hello"):
            try:
                client.call(method, p, 5.0)
                codes.add("OK")
            except grpc.RpcError as e:
                codes.add(e.code().name)
    assert not marker.exists()
    assert "INVALID_ARGUMENT" in codes and "UNKNOWN" not in codes and "INTERNAL" not in codes
    header, _ = wire.decode(client.call("Status", wire.encode({"kind": "status", "actor_id": 0}), 5.0), "ack")
    assert header["received"] == -1  # the valid-looking but short push was refused: nothing stored
    client.close()


def test_a_push_is_stored_once_and_gaps_are_counted(served):
    hub, port = served
    client = LearnerClient(f"127.0.0.1:{port}", TOKEN)
    client.call("Hello", _hello(), 5.0)

    def push(seq: int) -> dict:
        t = {"action": torch.zeros(1, 2, 3), "reward": torch.zeros(1, 2), "terminated": torch.zeros(1, 2, dtype=torch.bool),
             "truncated": torch.zeros(1, 2, dtype=torch.bool), "faulted": torch.zeros(1, 2, dtype=torch.bool),
             "actor": torch.zeros(1, 2, dtype=torch.long), "ep_return": torch.zeros(1, 2),
             "ep_length": torch.zeros(1, 2), "ep_success": torch.zeros(1, 2), "ep_counted": torch.zeros(1, 2, dtype=torch.bool),
             "obs.policy": torch.full((1, 2, 4), float(seq)), "next_obs.policy": torch.zeros(1, 2, 4)}
        msg = wire.encode({"kind": "transitions", "actor_id": 0, "seq": seq, "steps": 1, "session": "a1"}, t)
        return wire.decode(client.call("Push", msg, 5.0), "ack")[0]

    assert push(0)["received"] == 0
    assert push(0)["received"] == 0  # a resend: acknowledged, not stored again
    assert push(3)["received"] == 3  # 1 and 2 never came (the actor's spool dropped them)
    got = hub.drain()
    assert [b.seq for b in got] == [0, 3] and got[0].new_session and not got[1].new_session
    c = hub.counters()
    assert (c["remote/duplicates"], c["remote/lost"]) == (1.0, 2.0)
    client.close()


def _transitions(seq: int, steps: int = 1) -> bytes:
    t = {"action": torch.zeros(steps, 2, 3), "reward": torch.full((steps, 2), float(seq)),
         "terminated": torch.zeros(steps, 2, dtype=torch.bool), "truncated": torch.zeros(steps, 2, dtype=torch.bool),
         "faulted": torch.zeros(steps, 2, dtype=torch.bool), "actor": torch.zeros(steps, 2, dtype=torch.long),
         "ep_return": torch.zeros(steps, 2), "ep_length": torch.zeros(steps, 2), "ep_success": torch.zeros(steps, 2),
         "ep_counted": torch.zeros(steps, 2, dtype=torch.bool), "obs.policy": torch.zeros(steps, 2, 4),
         "next_obs.policy": torch.zeros(steps, 2, 4)}
    return wire.encode({"kind": "transitions", "actor_id": 0, "seq": seq, "steps": steps, "session": "a1"}, t)


def test_a_bundle_of_messages_is_stored_in_order_and_its_parts_are_checked_like_any(served):
    """A backlog crosses in one Push: the messages of a bundle are stored in order (a resent one counted as a
    duplicate), acknowledged after the last; a malformed or pickled part, a part of another kind or a bundle whose
    entries differ from its count is refused (INVALID_ARGUMENT) as a lone message would be."""
    hub, port = served
    client = LearnerClient(f"127.0.0.1:{port}", TOKEN)
    client.call("Hello", _hello(), 5.0)
    ack, _ = wire.decode(client.call("Push", wire.bundle([_transitions(0), _transitions(1), _transitions(2)]), 5.0),
                         "ack")
    assert ack["received"] == 2
    ack, _ = wire.decode(client.call("Push", wire.bundle([_transitions(2), _transitions(3)]), 5.0), "ack")
    assert ack["received"] == 3 and hub.counters()["remote/duplicates"] == 1.0
    got = hub.drain()
    assert [b.seq for b in got] == [0, 1, 2, 3] and [float(b.tensors["reward"][0, 0]) for b in got] == [0, 1, 2, 3]
    for bad in (wire.bundle([_transitions(4), b"\x00" * 40]), wire.bundle([pickle.dumps(object())]),
                wire.encode({"kind": "bundle", "count": 2}, {"m0": torch.zeros(3, dtype=torch.uint8)}),
                wire.bundle([wire.encode({"kind": "status", "actor_id": 0})])):
        with pytest.raises(grpc.RpcError) as err:
            client.call("Push", bad, 5.0)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    client.close()


def test_a_link_sends_a_backlog_in_bundles(served, tmp_path: Path, monkeypatch):
    """Ten messages waiting in the spool (a learner that was away) reach it in order in three Push calls of at most
    four messages, not ten round trips."""
    hub, _ = served
    pushes: list[int] = []
    real = hub.push

    def counted(request: bytes) -> bytes:
        header, _ = wire.decode(request)
        pushes.append(int(header.get("count", 1)))
        return real(request)

    monkeypatch.setattr(hub, "push", counted)
    server, port = serve(hub.handlers(), "127.0.0.1:0", TOKEN)
    spool = Spool(tmp_path / "spool")
    for seq in range(10):
        spool.put(seq, _transitions(seq))
    link = ActorLink(LearnerClient(f"127.0.0.1:{port}", TOKEN), _hello_header(), spool, 0.05, 2.0, max_per_push=4)
    link.start()
    try:
        deadline = time.monotonic() + 20
        while link.received < 9 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        link.close()
        server.stop(0)
    assert link.received == 9 and pushes == [4, 4, 2]
    assert [b.seq for b in hub.drain()] == list(range(10))


def _link(port: int, tmp: Path, heartbeat_s: float, deadline_s: float) -> ActorLink:
    """An actor's link (the served fixture's actor) to the learner on ``port``."""
    return ActorLink(LearnerClient(f"127.0.0.1:{port}", TOKEN), _hello_header(), Spool(tmp / "spool"), heartbeat_s,
                     deadline_s)


def test_link_retries_a_corrupted_chunk_and_gets_the_policy(served, tmp_path: Path, monkeypatch):
    """A network that flips a byte in one chunk the first time (a fake for a transport fault): the link counts a
    chunk error, asks again, and takes the intact blob."""
    hub, _ = served
    blob = os.urandom(3 * wire.CHUNK_BYTES // 2)
    hub.publish(blob)
    real = hub.parameters
    calls = {"n": 0}

    def flaky(request: bytes):
        calls["n"] += 1
        for i, c in enumerate(real(request)):
            if calls["n"] == 1 and i == 1:
                c = bytearray(c)
                c[-5] ^= 1
                c = bytes(c)
            yield c

    monkeypatch.setattr(hub, "parameters", flaky)
    server, port2 = serve(hub.handlers(), "127.0.0.1:0", TOKEN)
    link = _link(port2, tmp_path, 0.05, 2.0)
    link.start()
    try:
        deadline = time.monotonic() + 20
        got = None
        while got is None and time.monotonic() < deadline:
            got = link.take_policy()
            time.sleep(0.02)
        assert got is not None and got[1] == blob and got[0] == 1
        assert link.snapshot().chunk_errors == 1 and calls["n"] == 2
    finally:
        link.close()
        server.stop(0)


def test_link_detects_a_lost_learner_within_the_deadline(tmp_path: Path):
    """E1's detection: heartbeat 0.2 s, deadline 1 s; the learner's server gone -> the link knows within 2 s, and
    says hello again (a reconnect) when a learner serves on that port again."""
    hub = LearnerHub(Spec("so101_reach", 2, 3, {"policy": (4,)}, {"policy": torch.float32}), actors=1)
    server, port = serve(hub.handlers(), "127.0.0.1:0", TOKEN)
    link = _link(port, tmp_path, 0.2, 1.0)
    link.start()
    try:
        deadline = time.monotonic() + 10
        while not link.snapshot().connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link.snapshot().connected
        server.stop(0)
        gone = time.monotonic()
        while link.snapshot().connected and time.monotonic() < gone + 10:
            time.sleep(0.01)
        assert time.monotonic() - gone <= 2.0
        st = link.snapshot()
        assert not st.connected and st.missed >= 1 and st.lost_at > 0
        back = LearnerHub(Spec("so101_reach", 2, 3, {"policy": (4,)}, {"policy": torch.float32}), actors=1)
        server, _ = serve(back.handlers(), f"127.0.0.1:{port}", TOKEN)
        while not link.snapshot().connected and time.monotonic() < gone + 30:
            time.sleep(0.01)
        st = link.snapshot()
        assert st.connected and st.reconnects == 1 and st.missed == 0 and link.session == back.session
    finally:
        link.close()
        server.stop(0)
