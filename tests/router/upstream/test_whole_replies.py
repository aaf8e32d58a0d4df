"""Waiting for a whole (not streamed) reply, against real sockets: a node sends its head only
once it has generated the reply, so a long wait is a busy node, not a hung one, unless the
node also stops answering its scrapes (a real `Scraper` reads them here)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from tiergate.router.discovery.scraper import MetricsFetcher, Scraper
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.upstream.proxy import (
    Upstream,
    UpstreamError,
    UpstreamUnavailable,
    WholeReplyTimeout,
)

#: Real servers, and seconds of waiting: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]
PATH = "/v1/chat/completions"
IDLE_METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"


@dataclass
class Node:
    """A node that takes `reply_s` to generate each whole reply and sends its head then, as
    vLLM does. With `hangs`, it answers nothing more, scrapes included, once a request came;
    without `metrics`, it has no /metrics (an engine started without them)."""

    reply_s: float
    hangs: bool = False
    metrics: bool = True
    breaks_metrics: bool = False  # its /metrics answers 500 once a request came
    requests: int = 0
    left: int = 0  # requests whose client closed the connection before the reply

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            if self.requests and self.hangs:  # until the scraper gives up and hangs up
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
            status, body = (200, IDLE_METRICS) if self.metrics else (404, b"not found")
            if self.requests and self.breaks_metrics:
                status, body = 500, b"internal error"
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        while (await receive()).get("more_body"):
            pass
        self.requests += 1
        try:  # "generating": a client that leaves is seen as http.disconnect
            message = await asyncio.wait_for(receive(), 3600 if self.hangs else self.reply_s)
            if message["type"] == "http.disconnect":
                self.left += 1
                return
        except TimeoutError:
            pass
        reply = json.dumps({"choices": [{"message": {"content": "done"}}]}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": reply})


def endpoint(url: str) -> EndpointState:
    return EndpointState(url, "pool", "batched", "m", ("m",))


@pytest.fixture
def failed() -> list[str]:
    """The endpoints the upstream counted a failure for, in order."""
    return []


@asynccontextmanager
async def scraped(served: Served, *nodes: Node) -> AsyncIterator[list[EndpointState]]:
    """`nodes` served, and scraped every 0.1 s by a real `Scraper`, for the block: their
    endpoints."""
    with ExitStack() as stack:
        endpoints = [endpoint(stack.enter_context(served(node))) for node in nodes]
        fetcher = MetricsFetcher()
        scraper = Scraper(lambda: endpoints, fetcher, clock=time.monotonic, interval_s=0.1)
        scraper.start()
        try:
            yield endpoints
        finally:
            await scraper.stop()
            await fetcher.aclose()


@asynccontextmanager
async def upstream_of(failed: list[str], **settings: Any) -> AsyncIterator[Upstream]:
    """An `Upstream` with `settings` that puts the URLs it counts a failure for in `failed`;
    closed at the block's end (inside `scraped`'s, while the nodes still answer)."""
    upstream = Upstream(on_failure=lambda e: failed.append(e.url), **settings)
    try:
        yield upstream
    finally:
        await upstream.aclose()


async def each_scraped(endpoints: list[EndpointState]) -> None:
    """Until every endpoint has answered a scrape with its metrics."""
    while any(e.scraped_at_s is None for e in endpoints):
        await asyncio.sleep(0.02)


async def test_a_whole_reply_longer_than_the_read_timeout_is_waited_for(
    served: Served, failed: list[str]
) -> None:
    """A stream whose head does not come within the read timeout is a hung node's; a whole
    reply that takes as long is served, from the one endpoint it went to."""
    upstream = Upstream(
        read_timeout_s=0.3, whole_reply_timeout_s=30, on_failure=lambda e: failed.append(e.url)
    )
    try:
        with ExitStack() as stack:
            nodes = [Node(reply_s=1.0), Node(reply_s=1.0)]
            eps = [endpoint(stack.enter_context(served(node))) for node in nodes]
            opened = await upstream.open(eps, PATH, b"{}", {}, whole=True)
            assert (opened.status, opened.attempts, opened.endpoint) == (200, 1, eps[0])
            assert json.loads(await opened.read())["choices"][0]["message"]["content"] == "done"
            await opened.close()
            assert [n.requests for n in nodes] == [1, 0] and failed == []
            # The same wait for a stream's head is a hang: every endpoint fails it.
            with pytest.raises(UpstreamUnavailable, match="last: timed out"):
                await upstream.open(eps, PATH, b"{}", {})
            assert failed == [eps[0].url, eps[1].url]
        assert all(e.inflight == 0 for e in eps)
    finally:
        await upstream.aclose()


async def test_a_whole_reply_past_its_limit_is_a_504_tried_nowhere_else(
    served: Served, failed: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    upstream = Upstream(whole_reply_timeout_s=0.5, on_failure=lambda e: failed.append(e.url))
    try:
        with ExitStack() as stack:
            nodes = [Node(reply_s=30.0), Node(reply_s=0.0)]
            eps = [endpoint(stack.enter_context(served(node))) for node in nodes]
            with pytest.raises(WholeReplyTimeout) as caught:
                await upstream.open(eps, PATH, b"{}", {"x-tiergate-request-id": "r-9"}, whole=True)
            error = caught.value
            assert (error.status, error.code, error.attempts) == (504, "upstream_timeout", 1)
            assert "within 0.5 s" in str(error) and '"stream": true' in str(error)
            assert eps[0].url not in str(error)
            # Not held against the node, not repeated on the other one, and the node's work
            # was cancelled (its connection closed).
            assert failed == [] and nodes[1].requests == 0 and upstream.retries == 0
            deadline = time.monotonic() + 10
            while nodes[0].left != 1:
                assert time.monotonic() < deadline, "the node never saw the request cancelled"
                await asyncio.sleep(0.02)
        assert all(e.inflight == 0 for e in eps)
    finally:
        await upstream.aclose()
    (line,) = [r.getMessage() for r in caplog.records if "whole_reply_timeout" in r.getMessage()]
    assert "request_id=r-9 pool=pool" in line and f"endpoint={eps[0].url}" in line


async def test_a_node_that_stops_answering_its_scrapes_fails_the_wait_and_another_serves(
    served: Served, failed: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    nodes = (Node(reply_s=60.0, hangs=True), Node(reply_s=0.2))
    settings = {"whole_reply_timeout_s": 60, "unresponsive_after_s": 0.5}
    async with scraped(served, *nodes) as eps, upstream_of(failed, **settings) as upstream:
        await each_scraped(eps)
        opened = await upstream.open(eps, PATH, b"{}", {}, whole=True)
        assert (opened.status, opened.attempts, opened.endpoint) == (200, 2, eps[1])
        await opened.close()
        assert failed == [eps[0].url] and eps[0].scrape_failures >= 3
    assert all(e.inflight == 0 for e in eps)
    assert any("event=node_unresponsive" in r.getMessage() for r in caplog.records)


async def test_a_node_without_metrics_is_not_taken_for_hung(
    served: Served, failed: list[str]
) -> None:
    """An engine with no /metrics fails every scrape, but answers it (404): it is up, and only
    the limit bounds its whole replies. It answers every 0.1 s; silence for 1 s would take it
    for hung (ten scrapes: a loaded machine delays some), and its reply takes longer."""
    settings = {"whole_reply_timeout_s": 60, "unresponsive_after_s": 1.0}
    node = Node(reply_s=2.5, metrics=False)
    async with scraped(served, node) as eps, upstream_of(failed, **settings) as upstream:
        while eps[0].scrape_failures < 3:
            await asyncio.sleep(0.02)
        opened = await upstream.open(eps, PATH, b"{}", {}, whole=True)
        assert (opened.status, opened.attempts) == (200, 1) and failed == []
        await opened.close()


async def test_a_client_that_leaves_cancels_the_node_s_whole_reply(served: Served) -> None:
    upstream = Upstream()
    node = Node(reply_s=30.0)
    try:
        with served(node) as url:
            ep = endpoint(url)
            waiting = asyncio.ensure_future(upstream.open([ep], PATH, b"{}", {}, whole=True))
            while node.requests == 0:
                await asyncio.sleep(0.02)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert ep.inflight == 0
            deadline = time.monotonic() + 10
            while node.left != 1:
                assert time.monotonic() < deadline, "the node kept generating for nobody"
                await asyncio.sleep(0.02)
    finally:
        await upstream.aclose()


async def test_a_whole_body_that_stalls_after_its_head_times_out(served: Served) -> None:
    """The wait for a whole reply's head has no read timeout; its body still has one."""

    async def stalls(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b'{"choices":', "more_body": True})
        while (await receive())["type"] != "http.disconnect":  # until the router hangs up
            pass

    with served(stalls) as url:
        upstream = Upstream(read_timeout_s=0.3)
        try:
            opened = await upstream.open([endpoint(url)], PATH, b"{}", {}, whole=True)
            with pytest.raises(UpstreamError, match="TimeoutError"):
                await opened.read()
            await opened.close()
        finally:  # while the node is up: its handler ends once the connection is closed
            await upstream.aclose()


async def test_a_node_that_answers_its_scrapes_with_errors_is_not_taken_for_hung(
    served: Served, failed: list[str]
) -> None:
    """Metrics that break (500s) while the node generates say it is up: only a node that
    answers nothing is taken for hung (here 1 s of silence: ten scrapes)."""
    nodes = (Node(reply_s=2.5, breaks_metrics=True), Node(reply_s=0.1))
    settings = {"whole_reply_timeout_s": 60, "unresponsive_after_s": 1.0}
    async with scraped(served, *nodes) as eps, upstream_of(failed, **settings) as upstream:
        await each_scraped(eps)
        opened = await upstream.open(eps, PATH, b"{}", {}, whole=True)
        assert (opened.status, opened.attempts, opened.endpoint) == (200, 1, eps[0])
        await opened.close()
        assert failed == [] and eps[0].scrape_failures >= 3


async def test_the_limit_bounds_the_whole_request_not_each_endpoint(
    served: Served, failed: list[str]
) -> None:
    """The first node hangs and is given up on; the second gets what is left of the limit,
    less than it takes: a 504 on the second attempt, not a fresh limit per endpoint."""
    nodes = (Node(reply_s=60.0, hangs=True), Node(reply_s=2.9))
    settings = {"whole_reply_timeout_s": 3.0, "unresponsive_after_s": 0.5}
    async with scraped(served, *nodes) as eps, upstream_of(failed, **settings) as upstream:
        await each_scraped(eps)
        with pytest.raises(WholeReplyTimeout) as caught:
            await upstream.open(eps, PATH, b"{}", {}, whole=True)
        assert caught.value.attempts == 2 and failed == [eps[0].url]
        assert nodes[1].requests == 1
