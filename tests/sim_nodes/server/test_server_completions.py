"""Chat and text completions, streaming and not: shapes, usage, determinism."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from sim_server_helpers import MODEL, ClientFactory, chat, sse

from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec, SpeculativeSpec
from tiergate.sim_nodes.server import NODE_HEADER, TIMING_HEADER, replies
from tiergate.sim_nodes.server.generation import Piece, RequestPlan
from tiergate.sim_nodes.server.tokenizer import FillerText, count_tokens, split_tokens
from tiergate.sim_nodes.server.tool_calls import PlannedToolCall


async def test_chat_non_streaming_has_usage_and_text(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat("Hello there", max_tokens=7))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    assert body["id"].startswith("chatcmpl-")
    assert isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 7  # one filler word per token
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    # "Hello there" is Hell|o| ther|e: 4 tokens, + 3 for the message + 3 priming the reply.
    assert usage == {"prompt_tokens": 4 + 3 + 3, "completion_tokens": 7, "total_tokens": 17}
    assert r.headers[NODE_HEADER] == "sim-node"


async def test_default_max_tokens_stops(make_client: ClientFactory) -> None:
    client = await make_client(default_max_tokens=5)
    body = (await client.post("/v1/chat/completions", json=chat())).json()
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_max_completion_tokens_wins(client: httpx.AsyncClient) -> None:
    body = chat(max_tokens=9, max_completion_tokens=3)
    r = await client.post("/v1/chat/completions", json=body)
    assert r.json()["usage"]["completion_tokens"] == 3


async def test_chat_stream_chunks_and_done(client: httpx.AsyncClient) -> None:
    status, events = await sse(client, "/v1/chat/completions", chat(max_tokens=6, stream=True))
    assert status == 200
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert len(text.split()) == 6
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all("usage" not in c and "tiergate" not in c for c in chunks)


async def test_stream_include_usage(client: httpx.AsyncClient) -> None:
    body = chat(max_tokens=4, stream=True, stream_options={"include_usage": True})
    _, events = await sse(client, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 4
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 4


@pytest.mark.parametrize("timing", [False, True])
async def test_continuous_usage_says_the_tokens_sent_so_far_on_every_chunk(
    make_client: ClientFactory, timing: bool
) -> None:
    """vLLM's `continuous_usage_stats`: each chunk's usage counts the prompt and every token
    up to and including its own; a node decoding speculatively sends several in one chunk."""
    serving = ServingSpec(
        model=MODEL,
        accelerator="h100-sxm",
        batching=BatchingSpec(max_num_seqs=8),
        speculative_decoding=SpeculativeSpec(
            draft_model="llama-3.2-1b", tokens=4, acceptance_rate=0.9
        ),
    )
    client = await make_client(serving=serving)
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = chat(max_tokens=60, stream=True, stream_options=options)
    headers = {TIMING_HEADER: "1"} if timing else {}
    _, events = await sse(client, "/v1/chat/completions", body, headers)
    chunks, last = events[:-2], events[-2]
    sent = 0
    for chunk in chunks:
        sent += len(chunk["choices"][0]["delta"]["content"].split())  # a word a token
        usage = chunk["usage"]
        assert usage.keys() == last["usage"].keys()  # middle chunks write it by hand
        assert usage["completion_tokens"] == sent, chunk
        assert usage["prompt_tokens"] == last["usage"]["prompt_tokens"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + sent
        assert ("tiergate" in chunk) is timing
    assert sent == 60 and len(chunks) < 60  # some chunks carried several tokens
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 60


@pytest.mark.parametrize("timing", [False, True])
async def test_continuous_usage_comes_only_with_include_usage(
    client: httpx.AsyncClient, timing: bool
) -> None:
    body = chat(max_tokens=5, stream=True, stream_options={"continuous_usage_stats": True})
    headers = {TIMING_HEADER: "1"} if timing else {}
    _, events = await sse(client, "/v1/chat/completions", body, headers)
    assert events[-1] == "[DONE]" and len(events) > 2
    assert all("usage" not in e for e in events[:-1])


async def test_stream_timing_only_when_asked(client: httpx.AsyncClient) -> None:
    body = chat(max_tokens=3, stream=True)
    _, events = await sse(client, "/v1/chat/completions", body, {TIMING_HEADER: "1"})
    times = [e["tiergate"]["t"] for e in events[:-1]]
    assert len(times) >= 1
    assert times == sorted(times)


async def test_text_completion(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}
    )
    body = r.json()
    assert r.status_code == 200
    assert body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 4
    assert body["usage"]["prompt_tokens"] == count_tokens("Once upon a time")


async def test_text_completion_token_ids_and_stream(client: httpx.AsyncClient) -> None:
    body = {
        "model": MODEL,
        "prompt": [1, 2, 3],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    _, events = await sse(client, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["prompt_tokens"] == 3
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert len(text.split()) == 3


async def test_same_request_seed_same_text(make_client: ClientFactory) -> None:
    a = await make_client(seed=1)
    b = await make_client(seed=2)
    body = chat(max_tokens=12, seed=7)
    text_a = (await a.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]
    text_b = (await b.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]
    assert text_a == text_b


async def test_served_model_names(make_client: ClientFactory) -> None:
    client = await make_client(served_model_names=["fast", "fast-alias"])
    body = {**chat(max_tokens=2), "model": "fast-alias"}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.json()["model"] == "fast-alias"
    assert (await client.post("/v1/chat/completions", json=chat())).status_code == 404


def test_tokenizer_round_trips_and_counts() -> None:
    text = "Tokenizers split  supercalifragilistic words, and punctuation!\n"
    assert "".join(split_tokens(text)) == text
    assert count_tokens("Hello, world!") == 6  # Hell o , worl d !
    assert count_tokens("") == 0


@pytest.mark.parametrize("chat_endpoint", [True, False])
@pytest.mark.parametrize("timing", [True, False])
@pytest.mark.parametrize("tool", [True, False])
def test_middle_chunk_template_matches_schema(
    chat_endpoint: bool, timing: bool, tool: bool
) -> None:
    plan = RequestPlan("m\u2063odel", 3, 9, True, FillerText(random.Random(0)))
    if tool:
        plan.tool_call = PlannedToolCall("call_1", "f", '{"a": "\\"b"}', False)
    piece = Piece(' "quoted"\n\u00e9', 2, 12.3456789, None)
    middle = replies._MiddleChunk(plan, chat=chat_endpoint, timing=timing)
    assert middle._parts is not None  # the template is in use, not the fallback
    fast = middle.render(piece)
    slow = replies._chunk(plan, piece, first=False, chat=chat_endpoint, timing=timing)
    assert fast.startswith(b"data: ") and fast.endswith(b"\n\n")
    fast_json, slow_json = json.loads(fast[6:]), json.loads(slow[6:])
    if timing:  # the write time differs between the two renderings, and only it
        assert fast_json["tiergate"].pop("w") <= slow_json["tiergate"].pop("w")
        assert fast_json["tiergate"] == {"t": 12.3456789}
    assert fast_json == slow_json
