"""The upstream half of the proxy, against real sockets: one shared pool, no cookies carried,
retries before the first byte."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import pytest
from loopback_ports import refused_url

from tiergate.router.base.errors import RouterError
from tiergate.router.endpoints.hosted import HostedApi
from tiergate.router.endpoints.state import CandidateSet, EndpointState
from tiergate.router.upstream.proxy import REQUEST_ID_HEADER as REQUEST_ID
from tiergate.router.upstream.proxy import Upstream

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow


def endpoint(url: str) -> EndpointState:
    return EndpointState(url, "pool", "batched", "m", ("m",))


async def cookie_setter(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An upstream that sets a cookie and reports the Cookie header it was sent."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = dict(scope["headers"])
    body = json.dumps({"cookie": headers.get(b"cookie", b"").decode()}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"set-cookie", b"session=tenant-a; Path=/")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def test_no_cookie_from_one_reply_reaches_the_next_request(
    served: Callable[[Any], AbstractContextManager[str]],
) -> None:
    """A gateway shared by tenants must not replay one tenant's upstream cookie to another."""
    upstream = Upstream()
    try:
        with served(cookie_setter) as url:
            seen = []
            for _ in range(2):
                opened = await upstream.open([endpoint(url)], "/v1/chat/completions", b"{}", {})
                seen.append(json.loads(await opened.read())["cookie"])
                assert opened.response.headers["set-cookie"].startswith("session=")
                await opened.close()
        assert seen == ["", ""]
    finally:
        await upstream.aclose()


async def test_a_refused_connection_is_retried_on_the_next_endpoint(
    served: Callable[[Any], AbstractContextManager[str]],
) -> None:
    failed: list[str] = []
    upstream = Upstream(on_failure=lambda e: failed.append(e.url))
    try:
        with served(cookie_setter) as url:
            dead, alive = endpoint(refused_url()), endpoint(url)
            opened = await upstream.open([dead, alive], "/v1/chat/completions", b"{}", {})
            assert (opened.endpoint, opened.attempts) == (alive, 2)
            assert opened.status == 200
            assert alive.inflight == 1 and dead.inflight == 0
            await opened.close()
            assert alive.inflight == 0
        assert failed == [dead.url] and upstream.retries == 1
    finally:
        await upstream.aclose()


async def test_every_endpoint_failing_is_a_503_naming_no_endpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = Upstream(attempts=2)
    try:
        dead = [endpoint(refused_url()) for _ in range(3)]
        with pytest.raises(RouterError) as caught:
            await upstream.open(dead, "/v1/chat/completions", b"{}", {REQUEST_ID: "r-1"})
        assert caught.value.status == 503
        message = str(caught.value)
        assert message == (
            "no endpoint of the batched tier could serve the request after 2 attempt(s); "
            "last: connection failed (ClientConnectorError)"
        )
        assert all(e.inflight == 0 for e in dead)
    finally:
        await upstream.aclose()
    # The operator's log has what the client is not told: which endpoints, and how.
    (line,) = [r.getMessage() for r in caplog.records if "upstream_unavailable" in r.getMessage()]
    assert "request_id=r-1 tier=batched attempts=2" in line
    assert f"endpoints={dead[0].url},{dead[1].url} " in line


def answers(status: int) -> Callable[..., Awaitable[None]]:
    """An upstream that answers every request with `status` and an error envelope."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        body = json.dumps({"error": {"message": "x", "type": "x", "code": None}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    return app


@pytest.mark.parametrize(
    ("statuses", "counted", "opened_status"),
    [
        # Every endpoint answers 500: the request is the likely cause, nobody's failure.
        ((500, 500), [], None),
        ((500, 500, 500), [], None),
        # Another endpoint served it: the request was fine, the endpoints that failed it not.
        ((500, 200), [0], 200),
        ((500, 500, 200), [0, 1], 200),
        # Another endpoint refused it: the request is bad, the 500 not held against anyone.
        ((500, 400), [], 400),
        # Down, overloaded or unreachable: the endpoint's failure at once.
        ((503, 503), [0, 1], None),
        ((502, 500), [0], None),
        ((429, 504, 200), [0, 1], 200),
    ],
)
async def test_whose_fault_a_failure_is(
    served: Callable[[Any], AbstractContextManager[str]],
    statuses: tuple[int, ...],
    counted: list[int],
    opened_status: int | None,
) -> None:
    failed: list[str] = []
    succeeded: list[str] = []
    upstream = Upstream(on_failure=lambda e: failed.append(e.url),
                        on_success=lambda e: succeeded.append(e.url))  # fmt: skip
    try:
        with ExitStack() as stack:
            urls = [stack.enter_context(served(answers(status))) for status in statuses]
            eps = [endpoint(url) for url in urls]
            if opened_status is None:
                with pytest.raises(RouterError) as caught:
                    await upstream.open(eps, "/v1/chat/completions", b"{}", {})
                last = statuses[-1]
                assert str(caught.value).endswith(f"after {len(statuses)} attempt(s); "
                                                  f"last: HTTP {last}")  # fmt: skip
                assert not any(url in str(caught.value) for url in urls)
                assert succeeded == []
            else:
                opened = await upstream.open(eps, "/v1/chat/completions", b"{}", {})
                assert opened.status == opened_status and opened.endpoint is eps[-1]
                await opened.close()
                assert succeeded == [urls[-1]]
        assert failed == [urls[i] for i in counted]
        assert all(e.inflight == 0 for e in eps)
    finally:
        await upstream.aclose()


@pytest.mark.parametrize("bad", ["http://127.0.0.1:99999", "http://[::1", "http://a b"])
async def test_an_endpoint_url_that_cannot_be_used_counts_as_its_failure(
    served: Callable[[Any], AbstractContextManager[str]], bad: str
) -> None:
    # The config refuses such URLs; one from elsewhere must still not become a 500.
    failed: list[str] = []
    upstream = Upstream(on_failure=lambda e: failed.append(e.url))
    try:
        with served(cookie_setter) as url:
            broken, alive = endpoint(bad), endpoint(url)
            opened = await upstream.open([broken, alive], "/v1/chat/completions", b"{}", {})
            assert opened.endpoint is alive and opened.status == 200
            await opened.close()
        assert failed == [bad] and broken.inflight == 0
    finally:
        await upstream.aclose()


async def test_a_provider_with_its_limit_open_is_passed_over_and_held_against_nothing(
    served: Callable[[Any], AbstractContextManager[str]],
) -> None:
    """Picked, then filled by other requests before its turn: the next endpoint serves, and
    the provider is not called (it would answer 429) nor counted a failure."""
    failed: list[str] = []
    upstream = Upstream(on_failure=lambda e: failed.append(e.url))
    try:
        with served(cookie_setter) as url:
            provider = endpoint(refused_url())  # never reached: nothing listens there
            provider.hosted = HostedApi(provider.url, "prov", FixedKey(), max_concurrent=2)
            provider.inflight = 2
            node = endpoint(url)
            candidates = CandidateSet([provider, node], "m", "batched", [provider])
            assert list(upstream.usable(candidates)) == [node]
            provider.inflight = 1
            assert upstream.usable(candidates) is candidates  # room: every candidate, as it was
            provider.inflight = 2
            opened = await upstream.open([provider, node], "/v1/chat/completions", b"{}", {})
            assert (opened.endpoint, opened.status, opened.attempts) == (node, 200, 1)
            await opened.close()
            # Nor is it an attempt: two are allowed, a dead endpoint takes one, the node the other.
            two = Upstream(attempts=2, on_failure=lambda e: failed.append(e.url))
            try:
                dead = endpoint(refused_url())
                opened = await two.open([provider, dead, node], "/v1/chat/completions", b"{}", {})
                assert (opened.endpoint, opened.attempts) == (node, 2)
                await opened.close()
            finally:
                await two.aclose()
        assert failed == [dead.url] and provider.inflight == 2
    finally:
        await upstream.aclose()


class FixedKey:
    def value(self) -> str:
        return "sk-fixed"

    def describe(self) -> str:
        return "a fixed key"
