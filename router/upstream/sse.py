"""Rewriting an upstream SSE stream for the client, event by event, without buffering.

Every `data: {...}` chunk gets the `service_tier` that served it (in OpenAI's vocabulary:
router/request/tiers.py `openai_service_tier`), inserted as bytes rather than by re-encoding
the JSON: a busy router relays thousands of chunks a second. The usage chunk (which the router
always asks for, to bill) is parsed: its counts feed the ledger, and the client gets it, with
`cost_usd` added, only if it asked for usage. Upstream error events pass through and are remembered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

DONE = b"data: [DONE]\n\n"
#: More tokens than any one request has: a count beyond it is a node's bug, not a bill.
MAX_TOKEN_COUNT = 2**40


def usage_tokens(usage: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens of a node's `usage` object (an absent or null count is 0).
    ValueError unless each is a whole number in [0, MAX_TOKEN_COUNT): a negative count would
    credit the tenant, and an absurd one would overflow the ledger."""
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: object) -> int:
    if value is None:
        return 0
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < MAX_TOKEN_COUNT
        or value != int(value)
    ):
        raise ValueError(f"not a token count: {value!r}")
    return int(value)


class StreamRewriter:
    """Feed upstream bytes in, get client bytes out."""

    def __init__(
        self, service_tier: str, *, include_usage: bool, cost_of: Callable[[int, int], float]
    ) -> None:
        self._service_tier = service_tier
        self._tier_field = b'"service_tier":"' + service_tier.encode() + b'",'
        self._include_usage = include_usage
        self._cost_of = cost_of
        self._pending = b""
        self.usage: dict[str, Any] | None = None
        self.cost_usd: float | None = None
        self.content_chunks = 0  # chunks other than usage/[DONE]/errors
        self.error: dict[str, Any] | None = None
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """The complete events in `pending + data`, rewritten; a partial event waits."""
        buffer = self._pending + data if self._pending else data
        end = buffer.rfind(b"\n\n")
        if end < 0:
            self._pending = buffer
            return b""
        self._pending = buffer[end + 2 :]
        return b"".join(self._event(e) for e in buffer[:end].split(b"\n\n") if e)

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data: {"):
            if event.strip() == b"data: [DONE]":
                self.done = True
            return event + b"\n\n"
        if b'"usage":{' in event:
            return self._usage(event)
        if event.startswith(b'data: {"error"'):
            try:
                self.error = json.loads(event[6:]).get("error")
            except (ValueError, RecursionError):
                self.error = {"message": "malformed error event"}
            return event + b"\n\n"
        self.content_chunks += 1
        return b"data: {" + self._tier_field + event[7:] + b"\n\n"

    def _usage(self, event: bytes) -> bytes:
        try:
            data = json.loads(event[6:])
        except (ValueError, RecursionError):
            return event + b"\n\n"
        usage = data.get("usage")
        if isinstance(usage, dict):
            try:
                self.cost_usd = self._cost_of(*usage_tokens(usage))
                self.usage = usage
            except ValueError:
                usage = None  # billed as a stream without usage (router/upstream/relay.py `tally`)
        has_choices = bool(data.get("choices"))
        if not self._include_usage:
            if not has_choices:
                return b""  # the client did not ask for usage: the usage-only chunk goes
            data.pop("usage", None)
        elif isinstance(usage, dict):
            usage["cost_usd"] = round(self.cost_usd or 0.0, 10)
        if has_choices:
            self.content_chunks += 1
        data["service_tier"] = self._service_tier
        try:
            return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
        except RecursionError:  # read, but too deep to write back
            return event + b"\n\n"
