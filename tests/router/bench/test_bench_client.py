"""One bench request against scripted replies (httpx.MockTransport): what is measured and
how every kind of failure becomes a result instead of an exception."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from bench_helpers import (
    Handler,
    TickingClock,
    small_workload,
    sse,
    text_chunks,
    tool_chunks,
)

from tiergate.bench.client import check_tool_call, send_request
from tiergate.bench.results import RequestResult
from tiergate.bench.workload import TOOL_NAME

SSE_HEADERS = {"content-type": "text/event-stream"}


async def send(handler: Handler, *, tools: bool = False, timeout_s: float = 5.0) -> RequestResult:
    workload = small_workload(tools_fraction=1.0 if tools else 0.0)
    request = workload.plan(1)[0]
    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        return await send_request(
            client, workload, request, "m", timeout_s=timeout_s, clock=TickingClock()
        )


def reply(body: bytes, *, status: int = 200, headers: dict[str, str] | None = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={**SSE_HEADERS, **(headers or {})})

    return handler


async def test_a_text_stream_is_measured() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=sse(*text_chunks(5)), headers=SSE_HEADERS)

    r = await send(handler)
    assert r.ok and r.status == 200
    assert r.completion_tokens == 5
    assert r.ttft_s == 1.0  # the first content chunk is the clock's second reading
    assert r.e2e_s is not None and r.e2e_s > r.ttft_s
    assert r.served_tier == "batched" and r.pool is None and r.cost_usd is None
    assert seen[0].headers["x-tiergate-tier"] == "batched"
    assert json.loads(seen[0].content)["stream"] is True


async def test_tiergate_headers_are_read() -> None:
    r = await send(
        reply(
            sse(*text_chunks(3)),
            headers={
                "x-tiergate-tier": "premium",
                "x-tiergate-pool": "premium-a",
                "x-tiergate-escalated": "true",
                "x-tiergate-cost-usd": "0.25",
            },
        )
    )
    assert (r.requested_tier, r.served_tier, r.pool) == ("batched", "premium", "premium-a")
    assert r.escalated and r.cost_usd == 0.25


async def test_the_cost_in_the_usage_chunk_wins_over_the_header() -> None:
    r = await send(reply(sse(*text_chunks(3, cost_usd=0.5)), headers={"x-tiergate-cost-usd": "9"}))
    assert r.cost_usd == 0.5
    r = await send(reply(sse(*text_chunks(3)), headers={"x-tiergate-cost-usd": "not a number"}))
    assert r.cost_usd is None


async def test_the_body_service_tier_is_a_fallback_for_the_header() -> None:
    r = await send(reply(sse(*text_chunks(2, service_tier="wafer-scale"))))
    assert r.served_tier == "wafer-scale"
    r = await send(reply(sse(*text_chunks(2, service_tier="default"))))  # OpenAI's own value
    assert r.served_tier == "batched"


async def test_without_usage_each_delta_counts_as_a_token() -> None:
    r = await send(reply(sse(*text_chunks(4)[:-1])))
    assert r.ok and r.completion_tokens == 4 and r.prompt_tokens == 0


async def test_prompt_tokens_come_from_the_usage_chunk() -> None:
    r = await send(reply(sse(*text_chunks(3))))
    assert (r.prompt_tokens, r.completion_tokens) == (5, 3)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("3", 3.0), (" 0.5 ", 0.5), (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", None),
     ("-1", None), ("nan", None)],
)  # fmt: skip
async def test_a_429_keeps_its_retry_after(header: str | None, seconds: float | None) -> None:
    body = json.dumps({"error": {"message": "tier queue full"}}).encode()
    headers = {"retry-after": header} if header is not None else {}
    r = await send(reply(body, status=429, headers=headers))
    assert (r.error, r.error_message, r.retry_after_s) == ("429", "tier queue full", seconds)


async def test_only_a_429_s_retry_after_is_kept() -> None:
    r = await send(reply(b"{}", status=503, headers={"retry-after": "1"}))
    assert r.error == "503" and r.retry_after_s is None


async def test_an_http_error_is_counted_by_status() -> None:
    body = json.dumps({"error": {"message": "no capacity", "type": "x", "code": "y"}}).encode()
    r = await send(reply(body, status=503))
    assert (r.error, r.status, r.error_message) == ("503", 503, "no capacity")
    assert not r.ok and r.ttft_s is None


async def test_an_error_event_mid_stream_is_a_stream_error() -> None:
    error = {"error": {"message": "node died", "type": "server_error", "code": None}}
    r = await send(reply(sse(*text_chunks(3)[:2], error, done=False)))
    assert r.error == "stream" and r.error_message == "node died" and r.status == 200


@pytest.mark.parametrize("body", [sse(*text_chunks(3), done=False), sse("not json")])
async def test_a_stream_cut_short_or_garbled_is_a_stream_error(body: bytes) -> None:
    r = await send(reply(body))
    assert r.error == "stream"


async def test_transport_failures_become_results() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def drop(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("peer closed", request=request)

    assert (await send(refuse)).error == "connect"
    assert (await send(drop)).error == "transport"


async def test_a_reply_slower_than_the_timeout_is_a_timeout() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()  # never answers
        raise AssertionError

    workload = small_workload()
    transport = httpx.MockTransport(slow)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        r = await send_request(client, workload, workload.plan(1)[0], "m", timeout_s=0.01)
    assert r.error == "timeout"


async def test_a_valid_tool_call_passes() -> None:
    arguments = json.dumps({"command": "make test", "timeout_s": 30, "background": False})
    r = await send(reply(sse(*tool_chunks(arguments))), tools=True)
    assert r.ok and r.tool_call_expected and r.tool_call_valid is True
    assert r.ttft_s == 1.0  # a tool-call delta is the first output


@pytest.mark.parametrize(
    ("arguments", "name", "problem"),
    [
        ('{"command": "ls", "timeout_s": 3', TOOL_NAME, "not valid JSON"),
        ("{'command': 'ls', 'timeout_s': 3}", TOOL_NAME, "not valid JSON"),
        ('{"command": "ls"}', TOOL_NAME, "'timeout_s' is a required property"),
        ('{"command": "ls", "timeout_s": "3"}', TOOL_NAME, "is not of type 'integer'"),
        ('{"command": "ls", "timeout_s": 0}', TOOL_NAME, "less than the minimum"),
        ('{"command": "ls", "timeout_s": 3, "x": 1}', TOOL_NAME, "Additional properties"),
        ('{"command": "ls", "timeout_s": 3}', "other_tool", "called 'other_tool'"),
    ],
)
async def test_a_bad_tool_call_is_a_tool_call_error(
    arguments: str, name: str, problem: str
) -> None:
    r = await send(reply(sse(*tool_chunks(arguments, name=name))), tools=True)
    assert r.ok and r.tool_call_valid is False
    assert r.tool_call_problem is not None and problem in r.tool_call_problem


async def test_a_tool_call_cut_off_by_the_cap_says_so() -> None:
    r = await send(reply(sse(*tool_chunks('{"command": "l', finish="length"))), tools=True)
    assert r.tool_call_valid is False
    assert r.tool_call_problem == "arguments are not valid JSON (cut off by max_tokens)"


async def test_a_text_reply_to_a_tool_request_is_a_tool_call_error() -> None:
    r = await send(reply(sse(*text_chunks(3))), tools=True)
    assert r.tool_call_valid is False and r.tool_call_problem == "no tool call in the reply"


def test_check_tool_call_reads_the_first_call() -> None:
    good = json.dumps({"command": "ls", "timeout_s": 1})
    assert check_tool_call({0: TOOL_NAME}, {0: [good[:5], good[5:]]}) is None
    assert check_tool_call({}, {}) == "no tool call in the reply"
    assert check_tool_call({}, {0: [good]}) == f"called None, not {TOOL_NAME!r}"
