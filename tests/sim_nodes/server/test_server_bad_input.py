"""Bad input gets a 4xx in the OpenAI envelope, and the node keeps serving afterwards."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sim_server_helpers import MODEL, ClientFactory, chat, nested

from tiergate.common.nesting import MAX_NESTING

MESSAGES = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "word " * 140_000  # > 131072 tokens: longer than llama-3.1-8b's context


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def _tool(parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


def _tool_call(arguments: dict[str, Any]) -> list[dict[str, Any]]:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [{"role": "assistant", "tool_calls": [call]}, *MESSAGES]


CHAT_CASES: list[tuple[str, bytes, int, str | None, str | None]] = [
    # (case, body, status, code, param)
    ("invalid json", b'{"model": ', 400, None, None),
    ("empty body", b"", 400, None, None),
    ("not an object", b"[1, 2]", 400, None, None),
    ("a string", b'"hello"', 400, None, None),
    ("NaN", b'{"model": "x", "temperature": NaN}', 400, None, None),
    ("invalid utf-8", b'{"model": "\xff\xfe"}', 400, None, None),
    ("missing model", _body(messages=MESSAGES), 400, "missing_required_parameter", "model"),
    ("missing messages", _body(model=MODEL), 400, "missing_required_parameter", "messages"),
    ("empty messages", _body(model=MODEL, messages=[]), 400, "invalid_value", "messages"),
    ("messages not a list", _body(model=MODEL, messages="hi"), 400, "invalid_value", "messages"),
    (
        "bad role",
        _body(model=MODEL, messages=[{"role": "robot", "content": "x"}]),
        400,
        "invalid_value",
        "messages.0.role",
    ),
    (
        "content a number",
        _body(model=MODEL, messages=[{"role": "user", "content": 5}]),
        400,
        "invalid_value",
        None,
    ),
    ("model a number", _body(model=5, messages=MESSAGES), 400, "invalid_value", "model"),
    (
        "max_tokens a string",
        _body(model=MODEL, messages=MESSAGES, max_tokens="5"),
        400,
        "invalid_value",
        "max_tokens",
    ),
    (
        "max_tokens a bool",
        _body(model=MODEL, messages=MESSAGES, max_tokens=True),
        400,
        "invalid_value",
        "max_tokens",
    ),
    (
        "max_tokens zero",
        _body(model=MODEL, messages=MESSAGES, max_tokens=0),
        400,
        "invalid_value",
        "max_tokens",
    ),
    (
        "max_tokens negative",
        _body(model=MODEL, messages=MESSAGES, max_tokens=-3),
        400,
        "invalid_value",
        "max_tokens",
    ),
    (
        "max_tokens absurd",
        _body(model=MODEL, messages=MESSAGES, max_tokens=10**30),
        400,
        "context_length_exceeded",
        "messages",
    ),
    (
        "stream not a bool",
        _body(model=MODEL, messages=MESSAGES, stream="yes"),
        400,
        "invalid_value",
        "stream",
    ),
    ("n > 1", _body(model=MODEL, messages=MESSAGES, n=2), 400, "invalid_value", "n"),
    ("empty tools", _body(model=MODEL, messages=MESSAGES, tools=[]), 400, None, "tools"),
    (
        "tool_choice without tools",
        _body(model=MODEL, messages=MESSAGES, tool_choice="required"),
        400,
        None,
        "tool_choice",
    ),
    (
        "unknown tool_choice",
        _body(
            model=MODEL,
            messages=MESSAGES,
            tools=[{"type": "function", "function": {"name": "a"}}],
            tool_choice={"type": "function", "function": {"name": "b"}},
        ),
        400,
        None,
        "tool_choice",
    ),
    (
        "prompt longer than context",
        _body(model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}]),
        400,
        "context_length_exceeded",
        "messages",
    ),
    ("unknown model", _body(model="gpt-17", messages=MESSAGES), 404, "model_not_found", "model"),
    (
        "tool schema of objects nested 300 deep",
        _body(model=MODEL, messages=MESSAGES, tools=_tool(nested(300))),
        400,
        "invalid_value",
        "tools.0.function.parameters",
    ),
    (
        "tool schema of arrays nested 300 deep",
        _body(model=MODEL, messages=MESSAGES, tools=_tool(nested(300, arrays=True))),
        400,
        "invalid_value",
        "tools.0.function.parameters",
    ),
    (
        "tool schema one level too deep",
        _body(model=MODEL, messages=MESSAGES, tools=_tool(nested(MAX_NESTING + 1))),
        400,
        "invalid_value",
        "tools.0.function.parameters",
    ),
    (
        "earlier tool call nested 300 deep",
        _body(model=MODEL, messages=_tool_call(nested(300))),
        400,
        "invalid_value",
        "messages.0.tool_calls.0",
    ),
    (
        "stream_options without stream (vLLM refuses them)",
        _body(model=MODEL, messages=MESSAGES, stream_options={"include_usage": True}),
        400,
        "invalid_value",
        "stream_options",
    ),
    # Sampling fields, checked as vLLM checks them.
    *(
        (
            f"{field} {value!r}",
            _body(model=MODEL, messages=MESSAGES, **{field: value}),
            400,
            "invalid_value",
            param,
        )
        for field, value, param in [
            ("temperature", "hot", "temperature"),
            ("temperature", -1, "temperature"),
            ("top_p", 2, "top_p"),
            ("top_p", 0, "top_p"),
            ("presence_penalty", "x", "presence_penalty"),
            ("frequency_penalty", 10, "frequency_penalty"),
            ("stop", 5, "stop"),
            ("logit_bias", {"42": "y"}, "logit_bias.42"),
            ("logit_bias", {"42": 500}, "logit_bias.42"),
            ("user", 5, "user"),
            ("logprobs", "x", "logprobs"),
            ("top_logprobs", 1000, "top_logprobs"),
            ("response_format", "json", "response_format"),
            ("response_format", {"type": "xml"}, "response_format.type"),
            ("response_format", {"type": "json_schema"}, "response_format"),
            (
                "response_format",
                {"type": "json_schema", "json_schema": "x"},
                "response_format.json_schema",
            ),
        ]
    ),
]

COMPLETION_CASES: list[tuple[str, bytes, int, str | None, str | None]] = [
    ("missing prompt", _body(model=MODEL), 400, "missing_required_parameter", "prompt"),
    ("empty prompt", _body(model=MODEL, prompt=""), 400, None, "prompt"),
    ("several prompts", _body(model=MODEL, prompt=["a", "b"]), 400, None, "prompt"),
    ("prompt a number", _body(model=MODEL, prompt=3), 400, "invalid_value", "prompt"),
    (
        "prompt too long",
        _body(model=MODEL, prompt=[1] * 131_072, max_tokens=1),
        400,
        "context_length_exceeded",
        None,
    ),
    ("logprobs 1000", _body(model=MODEL, prompt="a", logprobs=1000), 400, None, "logprobs"),
    ("token id huge", _body(model=MODEL, prompt=[1, 10**30]), 400, None, "prompt"),
    ("token id negative", _body(model=MODEL, prompt=[-1, 2]), 400, None, "prompt"),
    ("token id past the vocabulary", _body(model=MODEL, prompt=[[128_256]]), 400, None, "prompt"),
    ("best_of 2", _body(model=MODEL, prompt="a", best_of=2), 400, None, "best_of"),
    ("echo a string", _body(model=MODEL, prompt="a", echo="x"), 400, None, "echo"),
    ("suffix a number", _body(model=MODEL, prompt="a", suffix=5), 400, None, "suffix"),
]


def _envelope_ok(
    response: httpx.Response, status: int, code: str | None, param: str | None
) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert isinstance(error["message"], str) and error["message"]
    expected_type = "invalid_request_error"
    assert error["type"] == expected_type
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param


@pytest.fixture
async def served(client: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """The client; after the test, the node must still answer a good request."""
    yield client
    r = await client.post("/v1/chat/completions", json=chat(max_tokens=2))
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("case", "body", "status", "code", "param"), CHAT_CASES, ids=[c[0] for c in CHAT_CASES]
)
async def test_bad_chat_request(
    served: httpx.AsyncClient,
    case: str,
    body: bytes,
    status: int,
    code: str | None,
    param: str | None,
) -> None:
    r = await served.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    _envelope_ok(r, status, code, param)


@pytest.mark.parametrize(
    ("case", "body", "status", "code", "param"),
    COMPLETION_CASES,
    ids=[c[0] for c in COMPLETION_CASES],
)
async def test_bad_completion_request(
    served: httpx.AsyncClient,
    case: str,
    body: bytes,
    status: int,
    code: str | None,
    param: str | None,
) -> None:
    r = await served.post("/v1/completions", content=body)
    _envelope_ok(r, status, code, param)


async def test_bad_streaming_request_is_plain_json_error(served: httpx.AsyncClient) -> None:
    r = await served.post("/v1/chat/completions", json={"model": MODEL, "stream": True})
    _envelope_ok(r, 400, "missing_required_parameter", "messages")


async def test_unknown_fields_are_ignored_and_sampling_fields_in_range_accepted(
    served: httpx.AsyncClient,
) -> None:
    body = chat(
        max_tokens=2,
        temperature=0.2,
        top_p=0.9,
        user="u",
        frobnicate={"x": 1},
        service_tier="priority",
        presence_penalty=-2,
        frequency_penalty=2,
        stop=["\n", "END"],
        logit_bias={"42": -100},
        logprobs=True,
        top_logprobs=20,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
    )
    assert (await served.post("/v1/chat/completions", json=body)).status_code == 200
    body = {"model": MODEL, "prompt": "a", "max_tokens": 2, "temperature": 0, "stop": "x",
            "logprobs": 5, "echo": False, "suffix": "", "best_of": 1}  # fmt: skip
    assert (await served.post("/v1/completions", json=body)).status_code == 200


@pytest.mark.parametrize("arrays", [False, True])
async def test_a_tool_schema_as_deep_as_allowed_is_served(
    served: httpx.AsyncClient, arrays: bool
) -> None:
    body = chat(max_tokens=2, tools=_tool(nested(MAX_NESTING, arrays=arrays)))
    r = await served.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


async def test_a_too_deep_schema_is_named_in_the_message(served: httpx.AsyncClient) -> None:
    r = await served.post("/v1/chat/completions", json=chat(tools=_tool(nested(300))))
    message = r.json()["error"]["message"]
    assert "tools.0.function.parameters" in message and str(MAX_NESTING) in message


async def test_body_too_large_by_content_length(make_client: ClientFactory) -> None:
    client = await make_client(max_body_bytes=1000)
    body = json.dumps(chat("x " * 1000)).encode()
    r = await client.post("/v1/chat/completions", content=body)
    _envelope_ok(r, 413, "request_too_large", None)


async def test_body_too_large_when_streamed(make_client: ClientFactory) -> None:
    client = await make_client(max_body_bytes=1000)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked upload
        for _ in range(20):
            yield b" " * 100

    r = await client.post("/v1/chat/completions", content=chunks())
    assert "content-length" not in r.request.headers
    _envelope_ok(r, 413, "request_too_large", None)
    ok = await client.post("/v1/chat/completions", json=chat(max_tokens=1))
    assert ok.status_code == 200


async def test_unknown_route_and_method(served: httpx.AsyncClient) -> None:
    r = await served.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await served.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


@pytest.mark.parametrize("depth", [512, 3000])  # 513 levels with the body; past json
async def test_a_body_nested_past_the_limit_says_so(served: httpx.AsyncClient, depth: int) -> None:
    """The router refuses such bodies in the same words; the node says it too, to a client
    that calls it directly, rather than that the body cannot be parsed."""
    body = _body(max_tokens=2)[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    r = await served.post("/v1/chat/completions", content=body)
    assert r.status_code == 400
    assert "more than 512 levels deep" in r.json()["error"]["message"]


async def test_a_body_of_too_many_arrays_says_so(served: httpx.AsyncClient) -> None:
    body = _body(max_tokens=2)[:-1] + b', "x": [' + b"[]," * 60_000 + b"[]]}"
    r = await served.post("/v1/chat/completions", content=body)
    assert r.status_code == 400
    assert "holds more than 50,000 arrays and objects" in r.json()["error"]["message"]
