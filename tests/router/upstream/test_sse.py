"""A node's usage counts: what the router bills, and what it refuses to."""

import json
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


def chunk(text: str, completion_tokens: int | None, *, tail: bytes = b"") -> bytes:
    """A content chunk as vLLM sends it when asked for continuous usage (None: without)."""
    content = json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode()
    usage = b""
    if completion_tokens is not None:
        usage = b',"usage":{"prompt_tokens":40006,"total_tokens":%d,"completion_tokens":%d}' % (
            40006 + completion_tokens,
            completion_tokens,
        )
    return b"data: " + content[:-1] + usage + tail + b"}\n\n"


def test_each_chunk_s_usage_counts_its_tokens_and_leaves_the_stream() -> None:
    r = rewriter(include_usage=False)
    out = r.feed(chunk("a b c", 3) + chunk(" d e", 5))
    assert r.counts == (40006, 5) and r.chunks_since_usage == 0 and r.content_chunks == 2
    events = [json.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [e["choices"][0]["delta"]["content"] for e in events] == ["a b c", " d e"]
    assert all("usage" not in e and e["service_tier"] == "default" for e in events)
    # A chunk the node sent without its usage counts a token.
    r.feed(chunk(" f", None))
    assert r.counts == (40006, 5) and r.chunks_since_usage == 1


@pytest.mark.parametrize(
    "event",
    [
        chunk("x", 2, tail=b',"tiergate":{"t":1.0,"w":2.0}'),  # usage before another key
        b'data: {"usage":{"prompt_tokens":7,"completion_tokens":2},"choices":[{"text":"x"}]}\n\n',
        b'data: {"choices":[{"text":"x"}],"usage":{"prompt_tokens":7,"total_tokens":9,'
        b'"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}\n\n',  # nested
        b'data: {"choices":[{"text":"x"}],"usage":{"note":"}","completion_tokens":2}}\n\n',
        # json.dumps' separators: the usage last, then first.
        b'data: {"choices": [{"text": "x"}], "usage": {"completion_tokens": 2}}\n\n',
        b'data: {"usage": {"completion_tokens": 2}, "choices": [{"text": "x"}]}\n\n',
    ],
)
def test_usage_is_cut_out_wherever_it_stands_in_a_chunk(event: bytes) -> None:
    r = rewriter(include_usage=True)  # the last usage chunk, not every chunk's
    out = r.feed(event)
    assert r.counts is not None and r.counts[1] == 2
    data = json.loads(out[6:])
    assert "usage" not in data and data["choices"] and data["service_tier"] == "default"


def test_a_client_that_asked_for_usage_on_every_chunk_gets_it_with_its_cost() -> None:
    r = StreamRewriter(
        "default", include_usage=True, continuous_usage=True, cost_of=lambda p, c: p + c * 10
    )
    data = json.loads(r.feed(chunk("a b", 2))[6:])
    assert data["usage"] == {
        "prompt_tokens": 40006, "total_tokens": 40008, "completion_tokens": 2, "cost_usd": 40026
    }  # fmt: skip


def test_a_chunk_s_usage_the_router_cannot_read_passes_and_counts_a_token() -> None:
    r = rewriter(include_usage=False)
    event = b'data: {"choices":[{"text":"x"}],"usage":{"completion_tokens":-3}}\n\n'
    assert json.loads(r.feed(event)[6:])["usage"] == {"completion_tokens": -3}
    assert r.counts is None and r.chunks_since_usage == 1


def choice_chunk(index: int, prompt_tokens: int, completion_tokens: int, **extra: Any) -> bytes:
    """A chunk of choice `index` as vLLM streams several: its usage is that choice's, over the
    prompt it answers (vLLM's serving_chat.py and serving_completion.py)."""
    data = {
        "id": "cmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": index, "delta": {"content": "x"}, "finish_reason": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        },
        **extra,
    }
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def several(choices_per_prompt: int) -> StreamRewriter:
    return StreamRewriter(
        "default",
        include_usage=False,
        cost_of=lambda p, c: 0.0,
        choices_per_prompt=choices_per_prompt,
    )


def test_a_stream_of_several_choices_is_counted_over_all_of_them() -> None:
    """n=3 on one prompt: three choices, each chunk saying its own tokens so far. A stream cut
    here is billed the prompt once and every choice's tokens."""
    r = several(3)
    for step in range(1, 5):
        for index in range(3):
            r.feed(choice_chunk(index, 12, step * (index + 1)))
    assert r.counts == (12, 4 + 8 + 12)
    r.feed(choice_chunk(1, 12, 9))  # choice 1 goes on; the others stay where they were
    assert r.counts == (12, 4 + 9 + 12)


def test_a_batch_of_prompts_counts_each_prompt_once() -> None:
    """Two prompts (5 and 7 tokens), n=2: choices 0-1 answer the first, 2-3 the second."""
    r = several(2)
    r.feed(b"".join(choice_chunk(i, (5, 5, 7, 7)[i], 10 + i) for i in range(4)))
    assert r.counts == (5 + 7, 10 + 11 + 12 + 13)
    # The last usage chunk says the request's totals: it is what is billed.
    r.feed(b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":50}}\n\n')
    assert r.counts == (12, 50)


def test_a_choice_written_in_another_order_is_still_found() -> None:
    r = several(2)
    r.feed(b'data: {"choices":[{"delta":{"content":"x"},"index":1}],'
           b'"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n')  # fmt: skip
    r.feed(choice_chunk(0, 3, 2))
    assert r.counts == (3, 6)


@pytest.mark.parametrize("choice", [b'{"delta":{"content":"x"},"index":"one"}',
                                    b'{"delta":{"content":"x"}}'])  # fmt: skip
def test_a_chunk_of_several_whose_choice_cannot_be_told_counts_a_token(choice: bytes) -> None:
    r = several(2)
    r.feed(choice_chunk(0, 3, 2))
    r.feed(b'data: {"choices":[' + choice + b'],'
           b'"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n')  # fmt: skip
    assert r.counts == (3, 2) and r.chunks_since_usage == 1


@pytest.mark.parametrize(
    "error",
    [
        {"message": "The model prov-x-2026 is overloaded", "type": "server_error",
         "param": None, "code": "prov-x-2026_overloaded",
         "metadata": {"raw": ["upstream prov-x-2026 said no"]}},
        "prov-x-2026 is overloaded",
    ],
)  # fmt: skip
def test_a_provider_s_error_event_is_told_in_the_name_the_client_asked_for(error: Any) -> None:
    event = b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    hosted = StreamRewriter("default", include_usage=False, cost_of=lambda p, c: 0.0,
                            model="chat", provider_model="prov-x-2026")  # fmt: skip
    out = hosted.feed(event)
    assert b"prov-x" not in out and b"chat is overloaded" in out
    assert "prov-x" not in json.dumps(hosted.error) and hosted.error
    node = rewriter(include_usage=False)  # a node's stream: its error event as it came
    assert node.feed(event) == event and node.error


def test_a_chunk_with_an_error_beside_its_choices_is_an_error_not_a_token() -> None:
    """OpenRouter's mid-stream error: a chunk with its own `error`, `finish_reason: "error"`."""
    chunk = {"id": "gen-1", "object": "chat.completion.chunk", "model": "prov-x-2026",
             "error": {"code": 502, "message": "prov-x-2026 disconnected"},
             "choices": [{"index": 0, "delta": {"content": ""},
                          "finish_reason": "error"}]}  # fmt: skip
    event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    hosted = StreamRewriter("default", include_usage=False, cost_of=lambda p, c: 0.0,
                            model="chat", provider_model="prov-x-2026")  # fmt: skip
    out = json.loads(hosted.feed(event)[6:])
    assert hosted.error == {"code": 502, "message": "chat disconnected"}
    assert hosted.content_chunks == 0  # no token: time to first token does not start here
    assert out["model"] == "chat" and out["service_tier"] == "default"
    assert out["error"] == hosted.error and out["choices"] == chunk["choices"]
    node = rewriter(include_usage=False)  # a node's: its names as they came, the tier added
    out = json.loads(node.feed(event)[6:])
    assert node.error == chunk["error"] and node.content_chunks == 0
    assert out == {**chunk, "service_tier": "default"}


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"choices":[{"index":0,"delta":{"content":"\\"error\\": 1"}}],"error":null}',
        b'data: {"choices":[{"index":0,"delta":{"content":"x"},"error":{"code":1}}]}',
        b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"error":""}',
        b'data: {"id":"1","error" "not json"}',
    ],
)
def test_a_chunk_that_only_mentions_an_error_is_a_token(event: bytes) -> None:
    r = rewriter(include_usage=False)
    out = r.feed(event + b"\n\n")
    assert r.error is None and r.content_chunks == 1
    assert out.startswith(b'data: {"service_tier":"default",')
