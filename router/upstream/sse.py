"""Rewriting an upstream SSE stream for the client, event by event, without buffering.

Every `data: {...}` chunk gets the `service_tier` that served it (in OpenAI's vocabulary:
router/base/tiers.py `openai_service_tier`), inserted as bytes rather than by re-encoding
the JSON: a busy router relays thousands of chunks a second.

The router asks the node for the usage on every chunk (vLLM's `continuous_usage_stats`): the
prompt as the node counted it and the tokens sent so far, so a stream cut short is billed what
it relayed, however many tokens a chunk carried. With several choices (`n`, or a completions
batch) a chunk's usage is its own choice's (vLLM's, for the choice and its prompt): the
request's is the sum over its choices, each prompt counted once. Only that small object of a
content chunk is parsed; it is cut out again unless the client asked for it too. The last usage
chunk (no choices) goes to the client, with `cost_usd` added, only if it asked for usage.
Upstream error events pass through and are remembered: `data: {"error": ...}` as OpenAI and
vLLM send it, or a chunk with a top-level `error` beside its choices (`finish_reason: "error"`),
as OpenRouter sends it, which is no token.

Events are read as the SSE spec writes them (CRLF, CR or LF line ends; `data:` with or without
its space; several data lines) and relayed in the one form the router writes, `data: ...\n\n`.
An event longer than `MAX_EVENT_BYTES` fails the stream (UpstreamError) rather than the router.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson

from tiergate.router.endpoints.hosted import in_pool_names
from tiergate.router.upstream.proxy import UpstreamError

DONE = b"data: [DONE]\n\n"
#: The most bytes one event may hold: far above any real chunk (one with logprobs, its top 20
#: alternatives and their bytes, is some KB), and low enough that an upstream that never ends an
#: event costs the router a bounded buffer, not all its memory.
MAX_EVENT_BYTES = 2**20
#: More tokens than any one request has: a count beyond it is a node's bug, not a bill.
MAX_TOKEN_COUNT = 2**40


def usage_tokens(usage: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens of a node's `usage` object (an absent or null count is 0).
    ValueError unless each is a whole number in [0, MAX_TOKEN_COUNT): a negative count would
    credit the tenant, and an absurd one would overflow the ledger."""
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


#: Built once: `int | float` written in the check builds the union on every call (twice a chunk).
_NUMBER = int | float


def _count(value: object) -> int:
    if value is None:
        return 0
    if (
        isinstance(value, bool)
        or not isinstance(value, _NUMBER)
        or not 0 <= value < MAX_TOKEN_COUNT
        or value != int(value)
    ):
        raise ValueError(f"not a token count: {value!r}")
    return int(value)


#: A chunk's `model` field (the first: the chunk's own, before its choices). A string inside
#: the chunk cannot match: its quotes are escaped.
_MODEL_FIELD = re.compile(rb'"model":\s*"(?:[^"\\]|\\.)*"')
#: A chunk's own `service_tier` (OpenAI's API sends one): replaced, as a second key would lose
#: to it in the client's parser (the last of a duplicate key wins).
_TIER_FIELD = re.compile(rb'"service_tier":\s*(?:"(?:[^"\\]|\\.)*"|[-+.\w]+)')
#: Reads one JSON value from a point in a text (the usage object inside a chunk).
_DECODER = json.JSONDecoder()
_USAGE_KEY = b'"usage":{'
_USAGE_KEY_SPACED = b'"usage": {'  # json.dumps' default separators (some providers')
#: How a chunk with no choices (the last usage chunk) says so, compact or not.
_NO_CHOICES, _NO_CHOICES_SPACED = b'"choices":[]', b'"choices": []'
#: CR and LF as ints: `int in bytes` is a memchr, where a one-byte `bytes in bytes` costs
#: several times more (CPython first tries the needle as an int, and clears the TypeError).
_CR, _LF = ord("\r"), ord("\n")
_TIER_KEY = b'"service_tier"'
#: A key named `error` (in a string its quotes are escaped): the chunk may be an error.
_ERROR_KEY = b'"error"'
#: A chunk's choice index where engines write it: the first key of its first choice.
_CHOICE_INDEX = re.compile(rb'"choices":\s*\[\s*\{\s*"index":\s*(\d{1,9})\s*[,}]')


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
        provider_model: str | None = None,
        choices_per_prompt: int | None = None,
    ) -> None:
        """`model`: the model name every chunk is to say (a hosted API's chunks name the
        provider's model; the client is told the name it asked for). None: as they come.
        `provider_model`: with `model`, the provider's name, which an error event of the
        stream may also name in its message: it is told in `model` there too.
        `choices_per_prompt`: the request's `n`, when it asked for more than one sequence: each
        chunk's usage is then its choice's, and `counts` their sum."""
        self._service_tier = service_tier
        self._model = model
        self._provider_model = provider_model if model is not None else None
        self._model_field = None if model is None else b'"model":' + orjson.dumps(model)
        self._tier_value = b'"service_tier":' + orjson.dumps(service_tier)
        self._tier_field = self._tier_value + b","
        self._include_usage = include_usage
        self._continuous_usage = continuous_usage
        self._cost_of = cost_of
        self._per_prompt = choices_per_prompt
        self._choices: dict[int, int] = {}  # choice index: its completion tokens so far
        self._prompts: dict[int, int] = {}  # prompt index: its tokens
        self._summed = (0, 0)  # over both
        self._pending = b""  # the start of an event, its line ends LF (but a CR last)
        self.usage: dict[str, Any] | None = None
        self.counts: tuple[int, int] | None = None
        self.cost_usd: float | None = None
        self.content_chunks = 0  # chunks other than usage/[DONE]/errors
        self.chunks_since_usage = 0
        self.error: dict[str, Any] | None = None
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """The complete events in `pending + data`, rewritten; a partial event waits.
        UpstreamError for an event longer than `MAX_EVENT_BYTES`."""
        buffer = self._pending + data if self._pending else data
        if _CR in buffer:
            return self._feed_lf(buffer)
        end = buffer.rfind(b"\n\n")
        if end < 0:
            if len(buffer) > MAX_EVENT_BYTES:
                raise self._too_long()
            self._pending = buffer
            return b""
        self._pending = buffer[end + 2 :]
        events = buffer[:end].split(b"\n\n")
        # An event read whole is held to the bound too: the same stream fails however it came.
        if (
            len(buffer) > MAX_EVENT_BYTES
            and max(map(len, [*events, self._pending])) > MAX_EVENT_BYTES
        ):
            raise self._too_long()
        return b"".join([self._event(e) for e in events if e])  # a list: faster than a generator

    def _feed_lf(self, buffer: bytes) -> bytes:
        """`feed` for bytes with CRLF or CR line ends (sse-starlette writes CRLF): read as LF.
        A CR last in the bytes ends its line now, but an LF read next would end the same line:
        in an event left waiting it stays a CR, read again with what follows. (After a CR that
        ended an event, that LF is a blank line, which the spec reads as nothing.)"""
        cr_last = buffer.endswith(b"\r")
        self._pending = b""
        out = self.feed(buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n"))
        if cr_last and self._pending:
            self._pending = self._pending[:-1] + b"\r"
        return out

    def _too_long(self) -> UpstreamError:
        self._pending = b""
        return UpstreamError(f"an event of the stream exceeded {MAX_EVENT_BYTES} bytes")

    def _event(self, event: bytes) -> bytes:
        """A `data: {...}` event, rewritten; other events are read by `_spec_event`."""
        if not event.startswith(b"data: {") or _LF in event:
            return self._spec_event(event)
        counted = False
        at, key = event.rfind(_USAGE_KEY), _USAGE_KEY
        if at < 0:
            at, key = event.rfind(_USAGE_KEY_SPACED), _USAGE_KEY_SPACED
        if at >= 0:
            if _NO_CHOICES in event or _NO_CHOICES_SPACED in event:
                return self._usage(event)
            event, counted = self._chunk_usage(event, at, len(key))
        elif event.startswith(b'data: {"error"'):
            return self._error_event(event)
        elif _ERROR_KEY in event and (chunk := _error_chunk(event)) is not None:
            return self._error_event(event, chunk)
        self.content_chunks += 1
        self.chunks_since_usage = 0 if counted else self.chunks_since_usage + 1
        if self._model_field is not None:
            field = self._model_field
            event = _MODEL_FIELD.sub(lambda _: field, event, count=1)
        tier = self._tier_value
        if event.find(_TIER_KEY) >= 0:
            event, replaced = _TIER_FIELD.subn(lambda _: tier, event, count=1)
            if replaced:
                return event + b"\n\n"
        return b"data: {" + self._tier_field + event[7:] + b"\n\n"

    def _error_event(self, event: bytes, chunk: dict[str, Any] | None = None) -> bytes:
        """An error event (a node's or a provider's, mid-stream): remembered, and relayed as
        it came, but that a provider's model name in its error object is told in the pool's.
        `chunk`: the event read, when it is a chunk with an error beside its choices; it says
        the model the client asked for and the tier that served it, as every chunk does."""
        if chunk is not None:
            data = chunk
        else:
            try:
                data = json.loads(event[6:])
            except (ValueError, RecursionError):
                self.error = {"message": "malformed error event"}
                return event + b"\n\n"
        error = data.get("error")
        rewrite = chunk is not None
        if self._provider_model and self._model is not None:
            if isinstance(error, dict):
                in_pool_names(error, self._provider_model, self._model)
            elif isinstance(error, str):
                data["error"] = error = error.replace(self._provider_model, self._model)
            rewrite = True
        if chunk is not None:
            if self._model is not None and "model" in data:
                data["model"] = self._model
            data["service_tier"] = self._service_tier
        if rewrite:
            try:
                event = b"data: " + json.dumps(data).encode()
            except RecursionError:  # read, but too deep to write back: relayed as it came
                pass
        self.error = error if error is None or isinstance(error, dict) else {"message": error}
        return event + b"\n\n"

    def _spec_event(self, event: bytes) -> bytes:
        """An event in any other form the SSE spec allows. Its data lines are one payload
        (joined by LF), relayed as `data: payload`; its other lines (comments, other fields)
        go in front of it as they are."""
        payload_lines: list[bytes] = []
        other_lines: list[bytes] = []
        for line in event.split(b"\n"):
            field, _, value = line.partition(b":")
            if field == b"data":
                payload_lines.append(value[1:] if value.startswith(b" ") else value)
            elif line:
                other_lines.append(line + b"\n")
        if not payload_lines:
            return b"".join(other_lines) + b"\n" if other_lines else b""
        payload = b"\n".join(payload_lines)
        if payload.strip() == b"[DONE]":
            self.done = True
            out = DONE
        elif payload.lstrip().startswith(b"{"):
            # A JSON text's line breaks lie between its tokens (a string holds none raw):
            # as spaces, the chunk is one data line.
            out = self._event(b"data: " + payload.lstrip().replace(b"\n", b" "))
        else:
            out = b"data: " + payload.replace(b"\n", b"\ndata: ") + b"\n\n"
        return b"".join(other_lines) + out if out else b""  # a chunk cut out goes whole

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
            if self._per_prompt is not None:
                counts = self._sum(_choice_index(event), counts)
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
        elif (head := event[:at].rstrip()).endswith(b","):
            at = len(head) - 1  # json.dumps' separators: `, "usage": {...}`
        return event[:at] + event[end:], True

    def _sum(self, index: int, counts: tuple[int, int]) -> tuple[int, int]:
        """The request's (prompt, completion) tokens so far, with choice `index`'s usage now
        `counts`."""
        assert self._per_prompt is not None
        prompt, completion = counts
        at = index // self._per_prompt
        summed_prompt, summed_completion = self._summed
        summed_prompt += prompt - self._prompts.get(at, 0)
        summed_completion += completion - self._choices.get(index, 0)
        self._prompts[at], self._choices[index] = prompt, completion
        self._summed = (summed_prompt, summed_completion)
        return self._summed

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


def _error_chunk(event: bytes) -> dict[str, Any] | None:
    """A `data: {...}` chunk read, if it has an `error` of its own (not one of a choice's
    fields); None for any other chunk, or one that is not JSON (relayed as it is)."""
    try:
        data = json.loads(event[6:])
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    return data if isinstance(error, (dict, str)) and error else None


def _choice_index(event: bytes) -> int:
    """The index of a `data: {...}` chunk's (first) choice. ValueError if it has none."""
    found = _CHOICE_INDEX.search(event)
    if found is not None:
        return int(found[1])
    try:  # written some other way: read the whole chunk (several choices are rare)
        index = orjson.loads(event[6:])["choices"][0]["index"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise ValueError("a chunk with usage but no choice index") from None
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 2**31:
        raise ValueError(f"not a choice index: {index!r}")
    return index
