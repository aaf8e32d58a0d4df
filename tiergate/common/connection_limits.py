"""Limits on an HTTP server's client connections (the router's, a sim node's), and the gate that
counts them.

A client must send a request's head within `header_timeout_s` of its first byte and its body
within `body_timeout_s` of the head; a new connection must begin its first request within
`header_timeout_s` too, and one kept alive after a response is closed after `idle_timeout_s`
with no request; at most
`max_connections` are open at once, past which a new connection gets a 503 and is closed at
once (limited_protocol.py does all of this inside uvicorn). The cap keeps the process below
its open-file limit, so what else needs a file descriptor (upstream connections, the ledger,
a reloaded file) still gets one (fd_budget.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "BODY",
    "CLIENT_KEEPALIVE_S",
    "DEFAULT_MAX_CONNECTIONS",
    "HEAD",
    "IDLE_TIMEOUT_S",
    "ConnectionGate",
    "ConnectionLimits",
    "Phase",
]

#: Past this, memory rather than file descriptors runs out first (~10 KB a connection, idle).
DEFAULT_MAX_CONNECTIONS = 10_000
#: How long a server keeps a connection alive after a response, by default: longer than its
#: clients and the proxies in front keep an idle connection for reuse (httpx 5 s, aiohttp 15 s,
#: nginx and AWS load balancers 60 s, Go 90 s), so that they close it first. A server that
#: closes first races a request sent on the connection in that instant, which fails with no
#: reply (a proxy answers it 502 or 503). uvicorn's own default, 5 s, is shorter than most.
IDLE_TIMEOUT_S = 120.0
#: How long tiergate's own clients (the bench) keep an idle connection for reuse: under every
#: server's keep-alive they talk to (vLLM's is uvicorn's 5 s), for the same reason.
CLIENT_KEEPALIVE_S = 2.0

#: The part of a request a timeout cut short: its head (request line and headers) or its body.
Phase = Literal["header", "body"]
HEAD: Final = "header"
BODY: Final = "body"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a client may take, and how many connections may be open."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def summary(self) -> str:
        """The limits as key=value pairs, for the line a server logs when it starts."""
        return (
            f"max_connections={self.max_connections} header_timeout_s={self.header_timeout_s:g} "
            f"body_timeout_s={self.body_timeout_s:g} idle_timeout_s={self.idle_timeout_s:g}"
        )


@dataclass(slots=True)
class ConnectionGate:
    """Admits connections up to the cap and counts what happened to them (metrics read
    `open`, `refused` and `timeouts`). Refusals are logged at most once every `log_every_s`,
    with how many there were since the previous line: a flood of them must not flood the log.
    """

    limits: ConnectionLimits
    log: logging.Logger
    clock: Callable[[], float] = time.monotonic
    log_every_s: float = 10.0
    open: int = 0
    refused: int = 0
    timeouts: dict[Phase, int] = field(default_factory=lambda: {HEAD: 0, BODY: 0})
    _unlogged: int = 0
    _next_log_s: float = float("-inf")

    def admit(self) -> bool:
        """Count a new connection in, or refuse it (False) when `max_connections` are open."""
        if self.open < self.limits.max_connections:
            self.open += 1
            return True
        self.refused += 1
        self._unlogged += 1
        now = self.clock()
        if now >= self._next_log_s:
            self._next_log_s = now + self.log_every_s
            self.log.warning(
                "event=connection_limit_reached open=%d max_connections=%d refused=%d "
                "refused_total=%d",
                self.open, self.limits.max_connections, self._unlogged, self.refused,
            )  # fmt: skip
            self._unlogged = 0
        return False

    def release(self) -> None:
        """An admitted connection closed."""
        self.open -= 1

    def timed_out(self, phase: Phase) -> None:
        """A connection was closed because a request's `phase` took too long."""
        self.timeouts[phase] += 1
