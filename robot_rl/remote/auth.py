"""A shared secret between the learner and its actors (RELIABILITY.md E5: an unauthenticated peer is refused).

Every RPC carries ``authorization: Bearer <token>`` in its metadata; the learner's interceptor compares it in
constant time and answers anything else with UNAUTHENTICATED before a handler reads a byte. The token comes from
``remote.token_file`` or the ``ROBOT_RL_TOKEN`` environment variable; a learner given neither makes one and writes
it (mode 600) into its run folder, where actors on the same machine (or a copy) read it. Over networks you do not
trust, add TLS (``remote.tls_cert`` / ``remote.tls_key`` on the learner, ``remote.tls_ca`` on actors).
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "ROBOT_RL_TOKEN"
TOKEN_FILE = "remote_token"  # in the learner's run folder when it made the token itself
METADATA_KEY = "authorization"


def read_token(token_file: str | None) -> str | None:
    """The token from ``token_file`` (stripped), else ``$ROBOT_RL_TOKEN``, else None."""
    if token_file:
        path = Path(token_file)
        if not path.is_file():
            raise FileNotFoundError(f"remote.token_file={token_file}: no such file (the learner writes its token "
                                    f"into <run_dir>/{TOKEN_FILE} when it makes one)")
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"remote.token_file={token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def make_token(run_dir: Path) -> str:
    """A fresh random token, written to ``run_dir/remote_token`` readable by its owner only."""
    token = secrets.token_urlsafe(32)
    path = run_dir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """What a client sends with every call."""
    return ((METADATA_KEY, f"Bearer {token}"),)


class TokenCheck(grpc.ServerInterceptor):
    """Refuse (UNAUTHENTICATED) every call whose metadata lacks ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}".encode()

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no valid token: pass the learner's token "
                          "(remote.token_file or $ROBOT_RL_TOKEN)")

        self._refuse_unary = grpc.unary_unary_rpc_method_handler(refuse)
        self._refuse_stream = grpc.unary_stream_rpc_method_handler(refuse)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        got = dict(details.invocation_metadata or ()).get(METADATA_KEY, "")
        if hmac.compare_digest(got.encode() if isinstance(got, str) else bytes(got), self.expected):
            return continuation(details)
        return self._refuse_stream if details.method.endswith("/Parameters") else self._refuse_unary
