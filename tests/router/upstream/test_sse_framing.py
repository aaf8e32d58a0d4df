"""How the stream rewriter reads an upstream's events: every line end and `data:` form the SSE
spec allows, a chunk that says its own `service_tier`, and an event that never ends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tiergate.router.upstream.proxy import UpstreamError
from tiergate.router.upstream.sse import DONE, MAX_EVENT_BYTES, StreamRewriter

#: A vLLM stream as the router reads it today: two content chunks with their usage so far, the
#: last usage chunk and [DONE], every event `data: ...` and LF LF.
VLLM = (
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"t0"}}],'
    b'"usage":{"prompt_tokens":10,"completion_tokens":1}}\n\n'
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"t1"}}],'
    b'"usage":{"prompt_tokens":10,"completion_tokens":2}}\n\n'
    b'data: {"id":"c1","model":"m","choices":[],'
    b'"usage":{"prompt_tokens":10,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


def rewriter(service_tier: str = "default") -> StreamRewriter:
    return StreamRewriter(
        service_tier, include_usage=True, cost_of=lambda p, c: p * 0.001 + c * 0.01
    )


def fed(stream: bytes, read_bytes: int | None = None) -> tuple[StreamRewriter, bytes]:
    """A rewriter fed `stream` whole or `read_bytes` at a time, and all it wrote."""
    r = rewriter()
    size = read_bytes or len(stream)
    return r, b"".join(r.feed(stream[at : at + size]) for at in range(0, len(stream), size))


def canonical() -> bytes:
    return fed(VLLM)[1]


def test_the_canonical_stream_is_rewritten_and_billed() -> None:
    r, out = fed(VLLM)
    assert r.content_chunks == 2 and r.counts == (10, 2) and r.done
    assert r.cost_usd == pytest.approx(0.03)
    assert out.endswith(DONE) and out.count(b'"service_tier":"default"') == 3


@pytest.mark.parametrize("read_bytes", [None, 1, 7, 64])
@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_crlf_and_cr_line_ends_are_read_as_lf(line_end: bytes, read_bytes: int | None) -> None:
    """sse-starlette ends its events `\\r\\n\\r\\n`; the spec allows CR alone too. However the
    reads cut them (a CRLF split between two), the client gets the stream the router writes."""
    r, out = fed(VLLM.replace(b"\n", line_end), read_bytes)
    assert out == canonical()
    assert r.content_chunks == 2 and r.counts == (10, 2) and r.done and r.cost_usd


@pytest.mark.parametrize("read_bytes", [None, 1, 5])
def test_data_without_the_space_after_its_colon_is_read(read_bytes: int | None) -> None:
    r, out = fed(VLLM.replace(b"data: ", b"data:"), read_bytes)
    assert out == canonical()
    assert r.content_chunks == 2 and r.done and r.cost_usd == pytest.approx(0.03)


def test_other_spec_forms_are_read_and_relayed_in_the_router_s() -> None:
    r, out = fed(
        b": keep-alive\n\n"  # a comment: passed on
        b'event: chunk\ndata:{"choices":[{"delta":\ndata: {"content":"a"}}]}\n\n'  # two lines
        b"\n\n\n"  # blank lines: no events
        b"data: [DONE] \n\n"
    )
    assert r.content_chunks == 1 and r.done
    assert out == (
        b": keep-alive\n\n"
        b'event: chunk\ndata: {"service_tier":"default","choices":[{"delta": {"content":"a"}}]}'
        b"\n\n" + DONE
    )


def test_a_usage_chunk_dropped_takes_its_other_lines_along() -> None:
    r = StreamRewriter("default", include_usage=False, cost_of=lambda p, c: 0.0)
    usage_chunk = b'id: 3\ndata:{"choices":[],"usage":{"prompt_tokens":4}}\n\n'
    assert r.feed(usage_chunk) == b"" and r.counts == (4, 0)


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys: {keys}"
    return dict(pairs)


@pytest.mark.parametrize("theirs", [b'"default"', b'"flex"', b" null"])
def test_a_chunk_s_own_service_tier_is_replaced_not_duplicated(theirs: bytes) -> None:
    """OpenAI's API writes `"service_tier":"default"` in every chunk: the client is told the
    tier that served it, once (a parser keeps the last of two keys)."""
    r = rewriter("priority")
    out = r.feed(
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","service_tier":'
        + theirs
        + b',"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'
    )
    chunk = json.loads(out[6:], object_pairs_hook=no_duplicate_keys)
    assert chunk["service_tier"] == "priority" and chunk["choices"][0]["delta"]["content"] == "a"
    assert r.content_chunks == 1


def test_an_event_that_never_ends_fails_the_stream_at_the_bound() -> None:
    """One token, then an event that never ends, 64 KiB a read: an UpstreamError (what the
    relay takes for a broken node) once the event is past the bound, not the router's memory."""
    r = rewriter()
    assert r.feed(VLLM.split(b"\n\n")[0] + b"\n\ndata: ")
    block = b"x" * 65536
    read = 0
    with pytest.raises(UpstreamError, match="exceeded"):
        while read <= 2 * MAX_EVENT_BYTES:
            assert r.feed(block) == b""
            read += len(block)
    assert MAX_EVENT_BYTES - len(block) <= read <= MAX_EVENT_BYTES


def test_an_event_past_the_bound_read_whole_fails_too() -> None:
    event = b'data: {"choices":[{"delta":{"content":"' + b"x" * MAX_EVENT_BYTES + b'"}}]}\n\n'
    with pytest.raises(UpstreamError):
        rewriter().feed(VLLM + event)


def test_events_up_to_the_bound_pass() -> None:
    content = b"x" * (MAX_EVENT_BYTES - 64)
    event = b'data: {"choices":[{"delta":{"content":"' + content + b'"}}]}\n\n'
    r, out = fed(event + VLLM, 65536)
    assert r.content_chunks == 3 and content in out and out.endswith(DONE)
