"""Fault injection, for testing routers and clients against a misbehaving node.

Two sources, checked per completion request:

* the request header ``x-tiergate-fault``, honoured only by a node started with it enabled
  (`tiergate sim-node --enable-fault-injection`; otherwise it is ignored, so a client that
  reaches a node cannot make it fail): an HTTP status (400-599) forces that error reply
  (429 carries ``Retry-After``); ``midstream`` lets a stream start and aborts it after
  `MIDSTREAM_AFTER_TOKENS` tokens (an SSE error event, no ``[DONE]``);
* the node's `failure_rate`: that fraction of requests (seeded, so reproducible in request
  order) fails with 500 or 503.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import ApiError, bad_request

__all__ = ["FAULT_HEADER", "MIDSTREAM_AFTER_TOKENS", "Fault", "FaultInjector"]

FAULT_HEADER = "x-tiergate-fault"
MIDSTREAM_AFTER_TOKENS = 3


@dataclass(frozen=True, slots=True)
class Fault:
    """An injected failure: an error status now, or an abort once generation has started."""

    status: int
    midstream: bool = False

    def error(self) -> ApiError:
        """The error reply (or, midstream, the error event) this fault produces."""
        if self.midstream:
            return ApiError(
                500,
                "The node aborted generation (injected fault).",
                code="injected_fault",
                error_type="server_error",
            )
        headers = {"retry-after": "1"} if self.status in (429, 503) else {}
        return ApiError(
            self.status,
            f"Injected fault: HTTP {self.status}.",
            code="injected_fault",
            headers=headers,
        )


class FaultInjector:
    """Decides, per request, whether and how it fails."""

    def __init__(
        self, failure_rate: float, rng: random.Random, *, header_enabled: bool = False
    ) -> None:
        self._failure_rate = failure_rate
        self._rng = rng
        self._header_enabled = header_enabled

    def decide(self, header: str | None) -> Fault | None:
        """The fault for a request carrying `header` (None: no fault header); the header is
        ignored unless this node honours it."""
        if header is not None and self._header_enabled:
            return _parse(header.strip())
        if self._failure_rate > 0 and self._rng.random() < self._failure_rate:
            return Fault(self._rng.choice((500, 503)))
        return None


def _parse(value: str) -> Fault:
    if value.lower() == "midstream":
        return Fault(500, midstream=True)
    try:
        status = int(value)
    except ValueError:
        status = 0
    if not 400 <= status <= 599:
        raise bad_request(
            f"{FAULT_HEADER} must be an HTTP error status (400-599) or 'midstream'",
            param=FAULT_HEADER,
        )
    return Fault(status)
