"""One bench request: send a streaming chat completion, read it to the end, measure it.

`send_request` never raises for anything the server or the network does: every outcome is
a `RequestResult`, errors included (`error` names the kind: an HTTP status such as ``"503"``,
``"stream"`` for an error event or a stream cut short, ``"timeout"``, ``"connect"``,
``"transport"``), so one bad reply cannot stop a run.

What tiergate's router adds to a reply, read when present (a plain OpenAI-compatible server
sends none of it, and the requested tier then counts as served):
response headers `x-tiergate-tier` (tier served), `x-tiergate-pool`, `x-tiergate-escalated`,
`x-tiergate-cost-usd`; and `usage.cost_usd` in the final usage chunk (preferred: the cost is
only known once the stream is over). A 429's `Retry-After` (in seconds) is kept on the result,
for the caller to pause by.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from tiergate.bench.results import RequestResult
from tiergate.bench.workload import TOOL_NAME, TOOL_SCHEMA, PlannedRequest, Workload
from tiergate.router.base.tiers import TIER_HEADER, TIERS

__all__ = [
    "COST_HEADER",
    "ESCALATED_HEADER",
    "POOL_HEADER",
    "RequestResult",
    "check_tool_call",
    "retry_after_s",
    "send_request",
]

POOL_HEADER = "x-tiergate-pool"
COST_HEADER = "x-tiergate-cost-usd"
ESCALATED_HEADER = "x-tiergate-escalated"

_VALIDATOR = Draft202012Validator(TOOL_SCHEMA)


@dataclass(slots=True)
class _Stream:
    """What the chunks of one stream said so far."""

    first_delta_s: float | None = None
    chunks_with_delta: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    cost_usd: float | None = None
    served_tier: str | None = None
    tool_names: dict[int, str] = field(default_factory=dict)
    tool_arguments: dict[int, list[str]] = field(default_factory=dict)
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None


async def send_request(
    client: httpx.AsyncClient,
    workload: Workload,
    request: PlannedRequest,
    model: str,
    *,
    timeout_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestResult:
    """Send `request` (a streaming chat completion for `model`) and measure it."""
    result = RequestResult(
        index=request.index,
        requested_tier=request.tier,
        served_tier=request.tier,
        model=model,
        tool_call_expected=request.with_tools,
    )
    start = clock()
    try:
        async with asyncio.timeout(timeout_s):
            await _exchange(client, workload, request, model, result, start, clock)
    except TimeoutError:
        _fail(result, "timeout", f"no complete reply within {timeout_s:g}s")
    except httpx.TimeoutException as exc:
        _fail(result, "timeout", type(exc).__name__)
    except httpx.ConnectError as exc:
        _fail(result, "connect", str(exc) or "connection failed")
    except httpx.HTTPError as exc:
        _fail(result, "transport", str(exc) or type(exc).__name__)
    result.e2e_s = clock() - start
    return result


async def _exchange(
    client: httpx.AsyncClient,
    workload: Workload,
    request: PlannedRequest,
    model: str,
    result: RequestResult,
    start: float,
    clock: Callable[[], float],
) -> None:
    body = workload.body(request, model)
    headers = {TIER_HEADER: request.tier}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as rsp:
        result.status = rsp.status_code
        served = rsp.headers.get(TIER_HEADER, "").strip().lower()
        if served in TIERS:
            result.served_tier = served
        result.pool = rsp.headers.get(POOL_HEADER)
        result.escalated = rsp.headers.get(ESCALATED_HEADER, "").strip().lower() == "true"
        header_cost = _cost(rsp.headers.get(COST_HEADER))
        if rsp.status_code >= 400:
            if rsp.status_code == 429:
                result.retry_after_s = retry_after_s(rsp.headers.get("retry-after"))
            await rsp.aread()
            _fail(result, str(rsp.status_code), _error_message(rsp.text))
            return
        stream = _Stream()
        async for line in rsp.aiter_lines():
            if line.startswith("data:"):
                _on_data(stream, line[5:].strip(), clock() - start)
                if stream.done or stream.error is not None:
                    break
    if stream.served_tier is not None and TIER_HEADER not in rsp.headers:
        result.served_tier = stream.served_tier
    result.ttft_s = stream.first_delta_s
    # No usage chunk (a server ignoring stream_options): one token per delta is the estimate.
    result.completion_tokens = (
        stream.usage_tokens if stream.usage_tokens is not None else stream.chunks_with_delta
    )
    result.prompt_tokens = stream.prompt_tokens or 0
    result.cost_usd = stream.cost_usd if stream.cost_usd is not None else header_cost
    if stream.error is not None:
        _fail(result, "stream", stream.error)
    elif not stream.done:
        _fail(result, "stream", "the stream ended without [DONE]")
    elif request.with_tools:
        problem = check_tool_call(stream.tool_names, stream.tool_arguments)
        if problem is not None and stream.finish_reason == "length":
            problem += " (cut off by max_tokens)"
        result.tool_call_valid = problem is None
        result.tool_call_problem = problem


def _on_data(stream: _Stream, data: str, elapsed_s: float) -> None:
    """Account one SSE `data:` payload."""
    if data == "[DONE]":
        stream.done = True
        return
    try:
        chunk = json.loads(data)
    except ValueError:
        stream.error = "an event is not JSON"
        return
    if not isinstance(chunk, dict):
        stream.error = "an event is not a JSON object"
        return
    if "error" in chunk:
        stream.error = _error_message(json.dumps(chunk))
        return
    tier = chunk.get("service_tier")
    if isinstance(tier, str) and tier in TIERS:
        stream.served_tier = tier
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        stream.usage_tokens = _count(usage.get("completion_tokens"), stream.usage_tokens)
        stream.prompt_tokens = _count(usage.get("prompt_tokens"), stream.prompt_tokens)
        cost = _cost(usage.get("cost_usd"))
        if cost is not None:
            stream.cost_usd = cost
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("finish_reason"), str):
            stream.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if isinstance(delta, dict) and _on_delta(stream, delta):
            stream.chunks_with_delta += 1
            if stream.first_delta_s is None:
                stream.first_delta_s = elapsed_s


def _on_delta(stream: _Stream, delta: dict[str, Any]) -> bool:
    """Record a delta's tool-call pieces; whether it carried output (text or a tool call)."""
    calls = delta.get("tool_calls")
    if isinstance(calls, list) and calls:
        for call in calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index", 0)
            index = index if isinstance(index, int) else 0
            function = call.get("function") or {}
            if isinstance(function.get("name"), str):
                stream.tool_names[index] = function["name"]
            arguments = function.get("arguments")
            stream.tool_arguments.setdefault(index, [])
            if isinstance(arguments, str):
                stream.tool_arguments[index].append(arguments)
        return True
    content = delta.get("content")
    return isinstance(content, str) and content != ""


def check_tool_call(names: dict[int, str], arguments: dict[int, list[str]]) -> str | None:
    """Why the streamed tool call is wrong, or None when it is a valid call of the tool."""
    if not names and not arguments:
        return "no tool call in the reply"
    first = min(set(names) | set(arguments))
    name = names.get(first)
    if name != TOOL_NAME:
        return f"called {name!r}, not {TOOL_NAME!r}"
    text = "".join(arguments.get(first, []))
    try:
        value = json.loads(text)
    except ValueError:
        return "arguments are not valid JSON"
    error = next(iter(_VALIDATOR.iter_errors(value)), None)
    if error is not None:
        return f"arguments do not match the schema: {error.message}"
    return None


def _fail(result: RequestResult, kind: str, message: str) -> None:
    result.error = kind
    result.error_message = message[:300]
    result.tool_call_valid = None


def retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` header's seconds, or None when absent or not a number of seconds (an
    HTTP date included: the router sends seconds)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _count(value: object, otherwise: int | None) -> int | None:
    """A token count from a usage field, else `otherwise`."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return otherwise


def _cost(value: object) -> float | None:
    """A cost in USD from a header or a JSON field, or None if absent or not a cost."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        cost = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return cost if math.isfinite(cost) and cost >= 0 else None


def _error_message(text: str) -> str:
    """The `error.message` of an OpenAI error envelope, else the start of the text."""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text[:200].strip() or "no message"
    return str(message)
