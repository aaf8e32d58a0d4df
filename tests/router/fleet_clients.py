"""Clients of a fleet of routers (fleet_helpers.py): a burst of requests at once, or a steady
load from a number of clients that a test can act on at a given count of replies (kill a
router, stop the database). Every request goes round robin over the routers, every other one
a stream, and each reply says how far the client got (a uniquely named module: conftest names
clash)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fleet_helpers import key

from tiergate.common.connection_limits import CLIENT_KEEPALIVE_S

#: What a client waits for one reply: past it a request counts as hung.
CLIENT_TIMEOUT_S = 30.0
#: The longest a load may take to reach what a test waits for.
LOAD_WITHIN_S = 120.0


@dataclass
class Reply:
    """What a client got for one request. `whole`: it read a 200 to its end (a stream through
    `[DONE]`, with no error event); `failure` names a transport error (the router died, the
    client timed out: "timeout"); `code` is a refusal's error code. `sent_in` and
    `answered_in` are the load's phase when the request went and when it ended."""

    router: int
    stream: bool
    tenant: str = ""
    status: int = 0
    code: str | None = None
    message: str = ""
    request_id: str | None = None
    whole: bool = False
    cost_usd: float = 0.0
    failure: str | None = None
    sent_in: str = ""
    answered_in: str = ""


def chat_body(max_tokens: int, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "coder",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def request(http: httpx.AsyncClient, url: str, max_tokens: int, reply: Reply) -> Reply:
    """One chat completion of `reply.tenant` from the router at `url`, read to its end, into
    `reply`."""
    body = chat_body(max_tokens, stream=reply.stream)
    headers = {"authorization": f"Bearer {key(reply.tenant)}"}
    try:
        async with http.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers
        ) as response:
            reply.status = response.status_code
            reply.request_id = response.headers.get("x-tiergate-request-id")
            if response.status_code != 200:
                error = json.loads(await response.aread())["error"]
                reply.code, reply.message = error["code"], error["message"]
            elif reply.stream:
                events = [x[6:] async for x in response.aiter_lines() if x.startswith("data: ")]
                errors = [e for e in events[:-1] if "error" in json.loads(e)]
                if len(events) > 1 and events[-1] == "[DONE]" and not errors:
                    reply.whole = True
                    reply.cost_usd = float(json.loads(events[-2])["usage"]["cost_usd"])
            else:
                json.loads(await response.aread())
                reply.whole = True
                reply.cost_usd = float(response.headers["x-tiergate-cost-usd"])
    except httpx.TimeoutException:
        reply.failure = "timeout"
    except httpx.TransportError as exc:
        reply.failure = type(exc).__name__
    return reply


def client(connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=CLIENT_TIMEOUT_S,
        limits=httpx.Limits(
            max_connections=connections,
            max_keepalive_connections=connections,
            keepalive_expiry=CLIENT_KEEPALIVE_S,  # below the router's idle timeout
        ),
    )


async def burst(urls: list[str], tenant: str, count: int, max_tokens: int) -> list[Reply]:
    """`count` requests at once, round robin over `urls`, every other one a stream."""
    async with client(count) as http:
        replies = [Reply(i % len(urls), bool(i % 2), tenant) for i in range(count)]
        await asyncio.gather(*(request(http, urls[r.router], max_tokens, r) for r in replies))
    return replies


class Load:
    """`clients` clients sending `total` requests between them, one after another each:
    request i to router i mod len(urls), of the tenants in turn, six requests each (one to
    each router, stream or not). `phase` names what the test did last, and each reply records
    it. `until` waits for a count of replies."""

    def __init__(
        self, urls: list[str], tenants: list[str], *, total: int, clients: int, max_tokens: int
    ) -> None:
        self.urls, self.tenants, self.total, self.clients = urls, tenants, total, clients
        self.max_tokens = max_tokens
        self._phase = "start"
        #: When each phase began (time.monotonic()), for the tests' reports.
        self.phase_started_s = {"start": time.monotonic()}
        self.replies: list[Reply] = []  # in the order they ended
        self._sent = 0
        self._done = False
        self._changed = asyncio.Condition()

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        self._phase = name
        self.phase_started_s[name] = time.monotonic()

    def phase_s(self, name: str, until: str) -> float:
        """How long phase `name` lasted, until phase `until` began."""
        return self.phase_started_s[until] - self.phase_started_s[name]

    async def run(self) -> list[Reply]:
        async with client(self.clients) as http:
            try:
                await asyncio.gather(*(self._client(http) for _ in range(self.clients)))
            finally:
                self._done = True
                async with self._changed:
                    self._changed.notify_all()
        return self.replies

    async def _client(self, http: httpx.AsyncClient) -> None:
        while self._sent < self.total:
            i, self._sent = self._sent, self._sent + 1
            tenant = self.tenants[i // 6 % len(self.tenants)]
            reply = Reply(i % len(self.urls), bool(i % 2), tenant, sent_in=self.phase)
            await request(http, self.urls[reply.router], self.max_tokens, reply)
            reply.answered_in = self.phase
            self.replies.append(reply)
            async with self._changed:
                self._changed.notify_all()

    def count(self, accept: Callable[[Reply], bool]) -> int:
        return sum(1 for reply in self.replies if accept(reply))

    async def until(self, accept: Callable[[Reply], bool], count: int, what: str) -> None:
        """Return once `count` replies are `accept`ed; fail saying `what` if the load ends
        first or it takes over LOAD_WITHIN_S."""

        def reached() -> bool:
            return self._done or self.count(accept) >= count

        try:
            async with asyncio.timeout(LOAD_WITHIN_S), self._changed:
                await self._changed.wait_for(reached)
        except TimeoutError:
            raise AssertionError(f"{what}: not within {LOAD_WITHIN_S} s") from None
        assert self.count(accept) >= count, f"{what}: the load ended first"


def whole(reply: Reply) -> bool:
    return reply.whole


def answered(reply: Reply) -> bool:
    return reply.status != 0


def usage(url: str, tenant: str) -> dict[str, Any]:
    """`GET /v1/usage` of `tenant` from the router at `url`."""
    got = httpx.get(
        url + "/v1/usage", headers={"authorization": f"Bearer {key(tenant)}"}, timeout=30
    )
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body
