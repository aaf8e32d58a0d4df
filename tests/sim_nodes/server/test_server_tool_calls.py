"""Tool calls: schema-conforming arguments, malformed at about 1 - quality, streamed in pieces."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from sim_server_helpers import ClientFactory, chat, sse

from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server.tool_calls import arguments_for_schema, malform, plan_tool_call

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "hourly": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            },
            "required": ["city", "days", "unit"],
        },
    },
}
SEARCH: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}


def conforms(args: dict[str, Any]) -> bool:
    return (
        isinstance(args["city"], str)
        and len(args["city"]) >= 2
        and isinstance(args["days"], int)
        and 1 <= args["days"] <= 7
        and args["unit"] in ("c", "f")
        and isinstance(args.get("hourly", False), bool)
        and all(isinstance(t, str) for t in args.get("tags", []))
        and len(args.get("tags", [])) <= 2
    )


async def test_tool_call_reply(make_client: ClientFactory) -> None:
    client = await make_client(model="frontier", serving=_frontier("frontier"))
    valid = 0
    for _ in range(10):
        r = await client.post(
            "/v1/chat/completions", json={**chat(), "model": "frontier", "tools": [WEATHER, SEARCH]}
        )
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function"
        assert call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        try:
            args = json.loads(call["function"]["arguments"])
        except ValueError:
            continue
        assert conforms(args)
        valid += 1
    assert valid >= 8  # quality 0.97


async def test_tool_choice_names_the_tool(client: httpx.AsyncClient) -> None:
    choice = {"type": "function", "function": {"name": "search"}}
    r = await client.post(
        "/v1/chat/completions", json=chat(tools=[WEATHER, SEARCH], tool_choice=choice)
    )
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "search"


async def test_tool_choice_none_replies_with_text(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice="none", max_tokens=3)
    )
    message = r.json()["choices"][0]["message"]
    assert "tool_calls" not in message
    assert len(message["content"].split()) == 3


async def test_tool_call_tokens_follow_arguments(client: httpx.AsyncClient) -> None:
    r = (await client.post("/v1/chat/completions", json=chat(tools=[WEATHER], seed=3))).json()
    from tiergate.sim_nodes.server.tokenizer import count_tokens

    arguments = r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert r["usage"]["completion_tokens"] == count_tokens(arguments)


async def test_tool_call_cut_by_max_tokens(client: httpx.AsyncClient) -> None:
    r = (await client.post("/v1/chat/completions", json=chat(tools=[WEATHER], max_tokens=3))).json()
    assert r["usage"]["completion_tokens"] == 3
    assert r["choices"][0]["finish_reason"] == "length"


async def test_streamed_tool_call_reassembles(client: httpx.AsyncClient) -> None:
    full = (await client.post("/v1/chat/completions", json=chat(tools=[WEATHER], seed=5))).json()
    status, events = await sse(
        client, "/v1/chat/completions", chat(tools=[WEATHER], seed=5, stream=True)
    )
    assert status == 200 and events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"]["tool_calls"][0] for e in events[:-1]]
    assert all(d["index"] == 0 for d in deltas)
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "get_weather"
    assert all("id" not in d and "name" not in d["function"] for d in deltas[1:])
    arguments = "".join(d["function"]["arguments"] for d in deltas)
    expected = full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert arguments == expected
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def _frontier(model: str) -> ServingSpec:
    accelerator = "wse-3" if model == "frontier-spark" else "b200"
    return ServingSpec(model=model, accelerator=accelerator, batching=BatchingSpec(max_num_seqs=8))


async def _malformed_fraction(make_client: ClientFactory, model: str, n: int) -> float:
    client = await make_client(serving=_frontier(model), seed=11)
    bad = 0
    for _ in range(n):
        body = {**chat(), "model": model, "tools": [WEATHER], "max_tokens": 200}
        reply = (await client.post("/v1/chat/completions", json=body)).json()
        arguments = reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        try:
            json.loads(arguments)
        except ValueError:
            bad += 1
    return bad / n


async def test_malformed_rate_follows_quality(make_client: ClientFactory) -> None:
    n = 200
    spark = await _malformed_fraction(make_client, "frontier-spark", n)  # quality 0.73
    full = await _malformed_fraction(make_client, "frontier", n)  # quality 0.97
    # Binomial standard errors are ~0.031 and ~0.012: these bounds are > 3 sigma wide.
    assert 0.17 <= spark <= 0.37
    assert full <= 0.08
    assert spark - full >= 0.12
    # Deterministic given the node seed and the request order.
    assert spark == await _malformed_fraction(make_client, "frontier-spark", n)


@pytest.mark.parametrize("seed", range(50))
def test_malform_always_breaks_json(seed: int) -> None:
    rng = random.Random(seed)
    value = arguments_for_schema(WEATHER["function"]["parameters"], rng)
    assert conforms(value)
    for text in (json.dumps(value), "{}"):
        with pytest.raises(ValueError):
            json.loads(malform(text, rng))


def test_plan_is_reproducible() -> None:
    a = plan_tool_call("f", WEATHER["function"]["parameters"], 0.5, random.Random("x"))
    b = plan_tool_call("f", WEATHER["function"]["parameters"], 0.5, random.Random("x"))
    assert a == b


def test_schema_corner_cases() -> None:
    rng = random.Random(0)
    assert arguments_for_schema({"const": 3}, rng) == 3
    assert arguments_for_schema({"type": ["null", "number"], "minimum": 2, "maximum": 2}, rng) == 2
    assert isinstance(arguments_for_schema({"anyOf": [{"type": "boolean"}]}, rng), bool)
    assert arguments_for_schema({"type": "string", "maxLength": 1}, rng) in (
        "a",
        "m",
        "b",
        "t",
        "u",
        "4",
    )
    assert arguments_for_schema("nonsense", rng) == "value"
