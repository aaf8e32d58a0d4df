"""Rewriting an upstream SSE stream for the client, event by event, without buffering.

Every `data: {...}` chunk gets the `service_tier` that served it (in OpenAI's vocabulary:
router/base/tiers.py `openai_service_tier`), inserted as bytes rather than by re-encoding
the JSON: a busy router relays thousands of chunks a second.

The router asks the node for the usage on every chunk (vLLM's `continuous_usage_stats`): the
prompt as the node counted it and the tokens sent so far, so a stream cut short is billed what
it relayed, however many tokens a chunk carried. Only that small object of a content chunk is
parsed; it is cut out again unless the client asked for it too. The last usage chunk (no
choices) goes to the client, with `cost_usd` added, only if it asked for usage. Upstream error
events pass through and are remembered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson

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


#: A chunk's `model` field (the first: the chunk's own, before its choices). A string inside
#: the chunk cannot match: its quotes are escaped.
_MODEL_FIELD = re.compile(rb'"model":\s*"(?:[^"\\]|\\.)*"')
#: Reads one JSON value from a point in a text (the usage object inside a chunk).
_DECODER = json.JSONDecoder()
_USAGE_KEY = b'"usage":{'
_USAGE_KEY_SPACED = b'"usage": {'  # json.dumps' default separators (some providers')
#: How a chunk with no choices (the last usage chunk) says so, compact or not.
_NO_CHOICES, _NO_CHOICES_SPACED = b'"choices":[]', b'"choices": []'


class StreamRewriter:
    """Feed upstream bytes in, get client bytes out.

    `usage` is the node's latest valid usage (a chunk's so far, or the stream's last), `counts`
    its (prompt, completion) tokens, and `chunks_since_usage` the content chunks relayed after
    it (a node that stopped saying its usage)."""

    def __init__(
        self,
        service_tier: str,
        *,
        include_usage: bool,
        cost_of: Callable[[int, int], float],
        continuous_usage: bool = False,
        model: str | None = None,
    ) -> None:
        """`model`: the model name every chunk is to say (a hosted API's chunks name the
        provider's model; the client is told the name it asked for). None: as they come."""
        self._service_tier = service_tier
        self._model = model
        self._model_field = None if model is None else b'"model":' + orjson.dumps(model)
        self._tier_field = b'"service_tier":"' + service_tier.encode() + b'",'
        self._include_usage = include_usage
        self._continuous_usage = continuous_usage
        self._cost_of = cost_of
        self._pending = b""
        self.usage: dict[str, Any] | None = None
        self.counts: tuple[int, int] | None = None
        self.cost_usd: float | None = None
        self.content_chunks = 0  # chunks other than usage/[DONE]/errors
        self.chunks_since_usage = 0
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
        counted = False
        at, key = event.rfind(_USAGE_KEY), _USAGE_KEY
        if at < 0:
            at, key = event.rfind(_USAGE_KEY_SPACED), _USAGE_KEY_SPACED
        if at >= 0:
            if _NO_CHOICES in event or _NO_CHOICES_SPACED in event:
                return self._usage(event)
            event, counted = self._chunk_usage(event, at, len(key))
        elif event.startswith(b'data: {"error"'):
            try:
                self.error = json.loads(event[6:]).get("error")
            except (ValueError, RecursionError):
                self.error = {"message": "malformed error event"}
            return event + b"\n\n"
        self.content_chunks += 1
        self.chunks_since_usage = 0 if counted else self.chunks_since_usage + 1
        if self._model_field is not None:
            field = self._model_field
            event = _MODEL_FIELD.sub(lambda _: field, event, count=1)
        return b"data: {" + self._tier_field + event[7:] + b"\n\n"

    def _chunk_usage(self, event: bytes, at: int, key_length: int) -> tuple[bytes, bool]:
        """A content chunk's usage so far, counted (whether it was); the chunk as the client is
        to get it: with the usage and its cost if it asked for usage on every chunk, else
        without it."""
        start = at + key_length - 1
        end = event.find(b"}", start) + 1
        try:
            try:
                usage = orjson.loads(event[start:end])  # flat, as engines send it: the fast way
            except orjson.JSONDecodeError:  # nested, or a "}" in a string: read to its end
                # latin-1: a character a byte, so the decoder's end is the usage's end.
                usage, end = _DECODER.raw_decode(event[start:].decode("latin-1"))
                end += start
            counts = usage_tokens(usage)
        except (ValueError, RecursionError):
            return event, False  # not a usage the router can read: passed on as it is
        self.usage, self.counts = usage, counts
        if self._continuous_usage:
            cost = json.dumps(round(self._cost_of(*counts), 10)).encode()
            return event[: end - 1] + b',"cost_usd":' + cost + event[end - 1 :], True
        if event[at - 1 : at] == b",":
            at -= 1  # the comma before it goes with it
        elif event[end : end + 1] == b",":
            end += 1  # the first key: the comma after it goes
        return event[:at] + event[end:], True

    def _usage(self, event: bytes) -> bytes:
        try:
            data = json.loads(event[6:])
        except (ValueError, RecursionError):
            return event + b"\n\n"
        usage = data.get("usage")
        if isinstance(usage, dict):
            try:
                self.counts = usage_tokens(usage)
                self.cost_usd = self._cost_of(*self.counts)
                self.usage, self.chunks_since_usage = usage, 0
            except ValueError:
                usage = None  # billed as a stream without usage (router/request/relay.py `tally`)
        if not self._include_usage:
            return b""  # the client did not ask for usage: the usage-only chunk goes
        if isinstance(usage, dict):
            usage["cost_usd"] = round(self.cost_usd or 0.0, 10)
        data["service_tier"] = self._service_tier
        if self._model is not None and "model" in data:
            data["model"] = self._model
        try:
            return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
        except RecursionError:  # read, but too deep to write back
            return event + b"\n\n"
