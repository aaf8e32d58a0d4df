"""uvicorn's httptools protocol with the limits uvicorn lacks (connection_limits.py).

uvicorn times out only a kept-alive connection between two requests, armed once a response
ends: a connection that never sends a byte, or sends its head or body slowly, stays open for
ever, and any byte (a blank line begins no request) disarms the idle timer. It has no
connection cap either (`limit_concurrency` answers 503 only once a request's head is in, so
each refused client still holds its descriptor until then), and httptools keeps a header
being received in memory however long it grows.

So, per connection, one timer at a time: idle (uvicorn's own; armed when the connection
opens too, for the first request's start, no longer than the head's timeout; and re-armed at
its deadline after bytes that begin no request), head or body.
A read timer is armed only when a packet ends in the middle of a head or a body: a request
that arrives in one packet, as nearly all do, costs no timer. A head still unfinished after
`MAX_HEAD_BYTES` more is refused (431).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .connection_limits import BODY, HEAD, ConnectionGate, ConnectionLimits, Phase

__all__ = ["MAX_HEAD_BYTES", "limited_protocol", "server_options"]

#: A request head may grow by this much after its first packet (which a read bounds).
MAX_HEAD_BYTES = 64 * 1024


def server_options(gate: ConnectionGate) -> dict[str, Any]:
    """`uvicorn.Config` keyword arguments that serve with `gate`'s limits (and no WebSocket:
    an upgraded connection would leave the protocol, and its count)."""
    return {
        "http": limited_protocol(gate),
        "ws": "none",
        "timeout_keep_alive": gate.limits.idle_timeout_s,
    }


def limited_protocol(gate: ConnectionGate) -> type[HttpToolsProtocol]:
    """A protocol class (uvicorn's `http=`) whose connections `gate` admits and counts."""

    class Limited(LimitedHttpToolsProtocol):
        _gate = gate
        _replies = _Replies(gate.limits)

    return Limited


class _Replies:
    """The canned replies, written straight to the transport (no ASGI app is involved)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.refused = _reply(
            503, "Service Unavailable", "server_error", "too_many_connections",
            f"the server has {limits.max_connections} connections open, its limit; retry later",
            retry_after_s=1,
        )  # fmt: skip
        self.timed_out = {
            phase: _reply(
                408,
                "Request Timeout",
                "invalid_request_error",
                "request_timeout",
                f"request {phase} not received within {timeout_s:g} s",
            )
            for phase, timeout_s in ((HEAD, limits.header_timeout_s), (BODY, limits.body_timeout_s))
        }
        self.head_too_large = _reply(
            431, "Request Header Fields Too Large", "invalid_request_error", "headers_too_large",
            f"request headers longer than {MAX_HEAD_BYTES} bytes",
        )  # fmt: skip
        self.not_http = _reply(
            400, "Bad Request", "invalid_request_error", "invalid_request",
            "the request is not valid HTTP/1.1 (its request line, a header or its framing)",
        )  # fmt: skip


def _reply(
    status: int, reason: str, type_: str, code: str, message: str, retry_after_s: int = 0
) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error envelope, closing the connection."""
    body = json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()
    retry = f"retry-after: {retry_after_s}\r\n" if retry_after_s else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{retry}\r\n"
    )
    return head.encode("ascii") + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """One client connection (`limited_protocol` binds the gate)."""

    _gate: ClassVar[ConnectionGate]
    _replies: ClassVar[_Replies]
    _admitted = False
    _reading: Phase | None = None  # the part of a request being received, if any
    _read_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0  # received after a head's first packet

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self._gate.admit():
            transport.write(self._replies.refused)
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        # A new connection begins its request within the head's time (a kept-alive one may
        # wait longer: its client is one that sent a request).
        first_s = min(self.timeout_keep_alive, self._gate.limits.header_timeout_s)
        self.timeout_keep_alive_task = self.loop.call_later(
            first_s, self.timeout_keep_alive_handler
        )

    def send_400_response(self, msg: str) -> None:
        """Bytes the HTTP parser refuses: the error envelope, as every other refusal, instead
        of uvicorn's plain-text line (whose words name the parser's complaint, not the fix)."""
        self.transport.write(self._replies.not_http)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._gate.release()
        self._reading = None
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        idle = self.timeout_keep_alive_task  # uvicorn disarms it on any byte
        in_head = self._reading is HEAD
        super().data_received(data)
        phase = self._reading
        if phase is None:
            if idle is not None and self.timeout_keep_alive_task is None:
                cycle = self.cycle  # None before a first request
                done = cycle is None or cycle.response_complete
                if done and not self.pipeline and not self.transport.is_closing():
                    # Bytes that began no request (blank lines): the idle deadline stands.
                    self.timeout_keep_alive_task = self.loop.call_at(
                        idle.when(), self.timeout_keep_alive_handler
                    )
            return
        if self.transport.is_closing():
            return
        if in_head and phase is HEAD:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._close(self._replies.head_too_large)
                return
        if self._read_timer is None:
            limits = self._gate.limits
            timeout_s = limits.header_timeout_s if phase is HEAD else limits.body_timeout_s
            self._read_timer = self.loop.call_later(timeout_s, self._read_timed_out)

    # The parser's callbacks: the part of a request being received. A timer is cancelled only
    # when one is armed (a request that spanned packets).
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = HEAD
        self._head_bytes = 0
        if self._read_timer is not None:
            self._disarm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._reading = BODY
        if self._read_timer is not None:
            self._disarm()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = None
        if self._read_timer is not None:
            self._disarm()

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        phase = self._reading
        if phase is None or self.transport.is_closing():
            return
        self._gate.timed_out(phase)
        cycle = self.cycle
        if phase is HEAD and cycle is not None and not cycle.response_complete:
            # A pipelined head behind a response still going out: finish that one, then close.
            cycle.keep_alive = False
            self.flow.pause_reading()
            return
        self._close(self._replies.timed_out[phase])

    def _close(self, reply: bytes) -> None:
        """Answer `reply` where no other response is going out, and close; what else the
        client sends is left unread."""
        cycle = self.cycle
        if self._reading is BODY:
            # The app's receive() now ends, and what its send() writes is dropped.
            busy = cycle.response_started or bool(self.pipeline)
            cycle.disconnected = True
        else:
            busy = cycle is not None and not cycle.response_complete
        if not busy:
            self.transport.write(reply)
        self._reading = None
        self._disarm()
        self.transport.close()
