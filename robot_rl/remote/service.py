"""The learner's RPC service over gRPC: four methods whose requests and replies are ``robot_rl.remote.wire`` bytes.

    Hello(hello) -> welcome            an actor joins (or rejoins): the learner's session, where its stream stands
    Push(transitions) -> ack           one message of transitions, acknowledged with the learner's state
    Status(status) -> ack              a heartbeat when there is nothing to push
    Parameters(pull) -> chunk stream   the newest policy (an exported policy folder) in checked chunks

gRPC gives the deadlines, reconnects, keepalives and flow control (DESIGN.md §7: "an existing RPC layer"); the bytes
are ours, so no generated code and no pickle. Every call needs the token (``robot_rl.remote.auth``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from robot_rl.remote.auth import TokenCheck, call_metadata
from robot_rl.remote.wire import MAX_MESSAGE_BYTES, Busy, WireError

SERVICE = "robot_rl.Learner"
UNARY = ("Hello", "Push", "Status")
STREAM = ("Parameters",)


def _options(max_bytes: int) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_bytes), ("grpc.max_receive_message_length", max_bytes),
            ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


def serve(handlers: dict[str, Callable[..., Any]], address: str, token: str, max_workers: int = 16,
          max_bytes: int = MAX_MESSAGE_BYTES, tls: tuple[bytes, bytes] | None = None) -> tuple[grpc.Server, int]:
    """Start the service on ``address`` ("host:port"; port 0 picks a free one); returns (server, port).

    ``handlers``: method name -> fn(request bytes) -> reply bytes (for ``Parameters``: an iterator of bytes). A
    ``WireError`` from a handler answers INVALID_ARGUMENT with its text. ``max_workers`` threads serve calls: keep
    headroom over the actors (each holds at most one call at a time, plus a parameter stream).
    """

    def unary(fn: Callable[[bytes], bytes]) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                return fn(request)
            except Busy as e:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
                raise
            except WireError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                raise  # abort raises; for type checkers

        return call

    def stream(fn: Callable[[bytes], Iterator[bytes]]) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        def call(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            try:
                for chunk in fn(request):
                    if not context.is_active():  # the actor went away: stop streaming to nobody
                        return
                    yield chunk
            except WireError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

        return call

    methods = {name: grpc.unary_unary_rpc_method_handler(unary(handlers[name])) for name in UNARY}
    methods.update({name: grpc.unary_stream_rpc_method_handler(stream(handlers[name])) for name in STREAM})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="learner-rpc"),
                         handlers=[grpc.method_handlers_generic_handler(SERVICE, methods)],
                         interceptors=[TokenCheck(token)], options=_options(max_bytes),
                         maximum_concurrent_rpcs=max_workers * 4)
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, grpc.ssl_server_credentials([(tls[1], tls[0])]))
    if port == 0:
        raise OSError(f"remote.listen={address}: could not bind (in use, or not an address of this machine)")
    server.start()
    return server, port


class LearnerClient:
    """An actor's end: one channel, each call with the token and a deadline (seconds).

    Raises ``grpc.RpcError`` on any failure (deadline, unavailable, refused); the caller decides what it means.
    """

    def __init__(self, address: str, token: str, max_bytes: int = MAX_MESSAGE_BYTES, tls_ca: bytes | None = None
                 ) -> None:
        opts = _options(max_bytes)
        self.channel = (grpc.insecure_channel(address, options=opts) if tls_ca is None
                        else grpc.secure_channel(address, grpc.ssl_channel_credentials(tls_ca), options=opts))
        self.metadata = call_metadata(token)
        self._unary = {m: self.channel.unary_unary(f"/{SERVICE}/{m}") for m in UNARY}
        self._stream = {m: self.channel.unary_stream(f"/{SERVICE}/{m}") for m in STREAM}

    def call(self, method: str, request: bytes, timeout: float) -> bytes:
        return self._unary[method](request, timeout=timeout, metadata=self.metadata)

    def stream(self, method: str, request: bytes, timeout: float) -> Iterator[bytes]:
        return self._stream[method](request, timeout=timeout, metadata=self.metadata)

    def close(self) -> None:
        self.channel.close()
