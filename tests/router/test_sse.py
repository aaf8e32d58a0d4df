"""A node's usage counts: what the router bills, and what it refuses to."""

from typing import Any

import pytest

from tiergate.router.upstream.sse import MAX_TOKEN_COUNT, StreamRewriter, usage_tokens


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": 1},  # would credit the tenant
        {"prompt_tokens": 1e19},  # no ledger integer holds it
        {"prompt_tokens": MAX_TOKEN_COUNT},
        {"completion_tokens": 2.5},
        {"completion_tokens": float("nan")},
        {"completion_tokens": float("inf")},
        {"completion_tokens": "12"},
        {"completion_tokens": True},
        {"completion_tokens": [1]},
    ],
)
def test_counts_that_are_not_token_counts_are_a_value_error(usage: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        usage_tokens(usage)


def test_token_counts_are_read_absent_ones_as_zero() -> None:
    assert usage_tokens({"prompt_tokens": 12, "completion_tokens": 3.0}) == (12, 3)
    assert usage_tokens({"prompt_tokens": None}) == (0, 0)


def rewriter(include_usage: bool) -> StreamRewriter:
    return StreamRewriter(
        "default", include_usage=include_usage, cost_of=lambda p, c: p * 0.001 + c * 0.01
    )


def test_a_stream_whose_usage_counts_are_bad_is_billed_as_one_without_usage() -> None:
    events = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":-1000000,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    quiet = rewriter(include_usage=False)
    out = quiet.feed(events)
    assert quiet.usage is None and quiet.cost_usd is None and quiet.content_chunks == 1
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n")
    asked = rewriter(include_usage=True)
    out = asked.feed(events)
    assert asked.usage is None and b"cost_usd" not in out  # passed on as the node said it


def test_a_good_usage_chunk_is_billed() -> None:
    r = rewriter(include_usage=True)
    out = r.feed(b'data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":2}}\n\n')
    assert r.usage == {"prompt_tokens": 100, "completion_tokens": 2, "cost_usd": 0.12}
    assert b'"cost_usd":0.12' in out


@pytest.mark.usefixtures("router_recursion_limit")
def test_a_usage_chunk_too_deep_to_read_passes_through_unbilled() -> None:
    r = rewriter(include_usage=True)
    deep = b"[" * 1100 + b"]" * 1100
    event = b'data: {"choices":[],"usage":{"prompt_tokens":1},"x":' + deep + b"}\n\n"
    assert r.feed(event) == event and r.usage is None
