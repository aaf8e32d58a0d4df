"""Helpers of the bench tests (a uniquely named module: conftest names clash)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from tiergate.bench.results import RequestResult
from tiergate.bench.stats import RunInfo
from tiergate.bench.workload import TOOL_NAME, Workload

Handler = Callable[[httpx.Request], httpx.Response]


def sse(*events: Any, done: bool = True) -> bytes:
    """An SSE body: each event JSON-encoded (strings sent as they are), then [DONE]."""
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def text_chunks(tokens: int, *, cost_usd: float | None = None, **extra: Any) -> list[Any]:
    """A streamed text reply of `tokens` one-token chunks and its usage chunk."""
    chunks: list[Any] = [
        {"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}
        for i in range(tokens)
    ]
    usage: dict[str, Any] = {"prompt_tokens": 5, "completion_tokens": tokens}
    if cost_usd is not None:
        usage["cost_usd"] = cost_usd
    chunks.append({"choices": [], "usage": usage, **extra})
    return chunks


def tool_chunks(arguments: str, *, name: str = TOOL_NAME, finish: str = "tool_calls") -> list[Any]:
    """A streamed tool call whose arguments arrive in three pieces."""
    third = max(1, len(arguments) // 3)
    pieces = [arguments[:third], arguments[third : 2 * third], arguments[2 * third :]]
    chunks: list[Any] = []
    for i, piece in enumerate(pieces):
        call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
        if i == 0:
            call.update(id="call_1", type="function")
            call["function"]["name"] = name
        last = i == len(pieces) - 1
        chunks.append(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [call]},
                        "finish_reason": finish if last else None,
                    }
                ]
            }
        )
    chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    return chunks


def models_response(entries: Iterable[dict[str, Any]]) -> httpx.Response:
    return httpx.Response(200, json={"object": "list", "data": list(entries)})


def small_workload(**overrides: Any) -> Workload:
    fields: dict[str, Any] = {
        "mix": {"batched": 1.0},
        "input_tokens": 20,
        "max_tokens": 8,
        "tools_fraction": 0.0,
        "seed": 1,
    }
    fields.update(overrides)
    return Workload(**fields)


class TickingClock:
    """Advances one second per reading: TTFT and e2e are exact, and a timed run of replies
    that take no time still ends."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def run_info(**overrides: Any) -> RunInfo:
    """The RunInfo of a small run of batched requests."""
    fields: dict[str, Any] = {
        "url": "http://router",
        "requests": 0,
        "concurrency": 1,
        "mix": {"batched": 1.0},
        "models": {"batched": "m"},
        "input_tokens": 10,
        "max_tokens": 10,
        "tools_fraction": 0.0,
        "seed": 0,
    }
    fields.update(overrides)
    return RunInfo(**fields)


def request_result(tier: str = "batched", **fields: Any) -> RequestResult:
    """A successful result of `tier` (TTFT 0.1 s, e2e 1.1 s, 11 completion tokens) but for
    `fields`."""
    base: dict[str, Any] = {
        "index": 0,
        "requested_tier": tier,
        "served_tier": tier,
        "model": "m",
        "status": 200,
        "ttft_s": 0.1,
        "e2e_s": 1.1,
        "completion_tokens": 11,
    }
    base.update(fields)
    return RequestResult(**base)
