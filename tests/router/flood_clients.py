"""Tenants flooding one tier of a running router: each caller is a closed loop of clients
sending streamed chat completions one after another (a 429 waits its Retry-After), and each
request records its tenant, status, time to first token and when it went. The router's own
count of the tokens it served each tenant (`tiergate_tenant_attained_tokens_total`) is read
from /metrics (a uniquely named module: conftest names clash)."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tiergate.common.connection_limits import CLIENT_KEEPALIVE_S

T = TypeVar("T")

#: What one client waits for one reply before it counts as hung.
CLIENT_TIMEOUT_S = 60.0
#: The longest a 429 makes a client wait before its next request.
MOST_RETRY_AFTER_S = 2.0
#: The floods running now, in this process (one event loop at a time).
_FLOODS: list[str] = []


@dataclass(frozen=True)
class Caller:
    """One tenant's load: `clients` in a closed loop, each prompt about `prompt_tokens`
    tokens long (one token per short word), asking for `max_tokens` (or, with `vary`, any
    number from half to one and a half times that, so replies do not end in step), and
    pausing `pause_s` between a reply and the next request."""

    tenant: str
    clients: int
    prompt_tokens: int = 16
    max_tokens: int = 32
    pause_s: float = 0.0
    vary: bool = False


@dataclass
class Sent:
    """One request: when it went (seconds from the flood's start), and how it went."""

    tenant: str
    sent_s: float
    status: int = 0
    ttft_s: float | None = None


async def flood(
    url: str, callers: list[Caller], duration_s: float, key: Callable[[str], str]
) -> list[Sent]:
    """Every caller's clients for `duration_s`; the requests they sent, finished ones only."""
    # The clients time what a caller would see. A full collection of this process' heap
    # (a pytest process holds every collected test module's objects: ~300 ms on 2 cores) would
    # add its pause to the one request it lands on, which no caller would see: what exists
    # before the first of the floods running at once is kept out of collections until the last
    # one ends.
    if not _FLOODS:
        gc.collect()
        gc.freeze()
    _FLOODS.append(url)
    try:
        return await _flood(url, callers, duration_s, key)
    finally:
        _FLOODS.remove(url)
        if not _FLOODS:
            gc.unfreeze()


async def _flood(
    url: str, callers: list[Caller], duration_s: float, key: Callable[[str], str]
) -> list[Sent]:
    sent: list[Sent] = []
    start = time.monotonic()
    connections = sum(c.clients for c in callers)
    # Idle connections are dropped before the router's idle timeout would close them (an
    # idle one reused in that instant fails with no reply).
    limits = httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=CLIENT_KEEPALIVE_S,
    )
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as http:

        async def one_client(caller: Caller, seed: int) -> None:
            draw = random.Random(seed)
            headers = {"authorization": f"Bearer {key(caller.tenant)}"}
            body = {
                "model": "coder",
                "messages": [{"role": "user", "content": "go " * caller.prompt_tokens}],
                "max_tokens": caller.max_tokens,
                "stream": True,
            }
            while time.monotonic() - start < duration_s:
                if caller.vary:
                    low = max(caller.max_tokens // 2, 1)
                    body["max_tokens"] = draw.randint(low, caller.max_tokens * 3 // 2)
                record = Sent(caller.tenant, time.monotonic() - start)
                wait_s = await _one(http, url, headers, body, record)
                sent.append(record)
                if wait_s or caller.pause_s:
                    await asyncio.sleep(max(wait_s, caller.pause_s))

        clients = [c for c in callers for _ in range(c.clients)]
        await asyncio.gather(*(one_client(c, seed) for seed, c in enumerate(clients)))
    return sent


async def _one(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, object],
    record: Sent,
) -> float:  # fmt: skip
    """Send one request into `record`; the seconds to wait before the next (a 429's)."""
    began = time.monotonic()
    async with http.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        record.status = response.status_code
        if response.status_code == 429:
            await response.aread()
            try:
                return min(float(response.headers.get("retry-after", "1")), MOST_RETRY_AFTER_S)
            except ValueError:
                return 1.0
        async for line in response.aiter_lines():
            if record.ttft_s is None and line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    record.ttft_s = time.monotonic() - began
    return 0.0


def attained_tokens(metrics_url: str, tier: str = "batched") -> dict[str, float]:
    """Tenant -> tokens the router's `tier` has served it so far (its /metrics, the full URL
    on its metrics port)."""
    text = httpx.get(metrics_url, timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "tiergate_tenant_attained_tokens":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("tier") == tier:
                found[sample.labels["tenant"]] = sample.value
    return found


def shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each tenant's share of the tokens served between two `attained_tokens` readings."""
    served = {t: after.get(t, 0.0) - before.get(t, 0.0) for t in after}
    total = sum(served.values()) or 1.0
    return {t: n / total for t, n in served.items()}


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def side_by_side(first: Coroutine[Any, Any, T], second: Coroutine[Any, Any, T]) -> tuple[T, T]:
    """Two measurements run at once, over the same seconds of the machine; their results."""

    async def both() -> tuple[T, T]:
        a, b = await asyncio.gather(first, second)
        return a, b

    return asyncio.run(both())
