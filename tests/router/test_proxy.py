"""The upstream half of the proxy, against real sockets: one shared pool, no cookies carried,
retries before the first byte."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

from tiergate.router.errors import RouterError
from tiergate.router.proxy import Upstream
from tiergate.router.state import EndpointState


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


def refused_url() -> str:
    """A localhost URL nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


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


async def test_every_endpoint_failing_is_a_503_naming_the_last_failure() -> None:
    upstream = Upstream(attempts=2)
    try:
        dead = [endpoint(refused_url()) for _ in range(3)]
        with pytest.raises(RouterError) as caught:
            await upstream.open(dead, "/v1/chat/completions", b"{}", {})
        assert caught.value.status == 503
        assert "after 2 attempt(s)" in str(caught.value) and dead[1].url in str(caught.value)
        assert all(e.inflight == 0 for e in dead)
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
