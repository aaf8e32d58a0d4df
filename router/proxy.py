"""The upstream half of the proxy: one shared connection pool, bounded retries, outliers.

Requests go straight to one shared httpx transport (the connection pool), not through an
`httpx.AsyncClient`: a client adds a cookie jar, and a gateway must not keep one tenant's
upstream cookies and send them with another tenant's request (it also cost ~15% of the
router's CPU per request, with redirect and auth handling the router never uses). Timeouts are
explicit per request (`UPSTREAM_TIMEOUT`), limits on the pool (`default_transport`).

`Upstream.open(...)` sends a request to the first endpoint of the picked order and returns
the upstream response with its headers read and its body not yet (streaming). A connection
error, a timeout before the response starts, or a 5xx/429 status is retried on the next
endpoint, with a short backoff, at most `attempts` times; nothing has reached the client yet,
so a retry is invisible to it. Failures and successes feed outlier detection through the
`on_failure` / `on_success` callbacks. Once the body starts flowing the caller owns the
response (a failure then is mid-stream and is the caller's to report).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
from httpx_aiohttp import AiohttpTransport

from .errors import RouterError
from .state import EndpointState

#: Statuses worth another endpoint: the endpoint is broken or overloaded, not the request.
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Backoff before the 2nd, 3rd, ... attempt (seconds); the last value repeats.
BACKOFF_S = (0.0, 0.02, 0.1)


#: Explicit upstream timeouts: connecting and waiting for a pooled connection are short (a dead
#: endpoint must be retried elsewhere quickly); reading is long (a stream may pause while a busy
#: node prefills a long prompt).
UPSTREAM_TIMEOUT = httpx.Timeout(connect=2.0, read=300.0, write=30.0, pool=5.0)


def default_transport(*, max_connections: int = 1024) -> httpx.AsyncBaseTransport:
    """The one connection pool every upstream request goes through.

    An httpx transport backed by aiohttp's connection pool (httpx-aiohttp). httpx's own pool
    (httpcore) walks every pooled connection, querying each socket, on every request and every
    release: at 64 concurrent connections that walk was ~45% of the router's CPU and held it
    to ~90-430 req/s (benchmarks/router_overhead.py, py-spy). aiohttp's pool keeps idle
    connections per origin and takes one in O(1).
    """
    return AiohttpTransport(
        limits=httpx.Limits(max_connections=max_connections, keepalive_expiry=30.0)
    )


@dataclass(slots=True)
class Opened:
    """An upstream response whose headers have arrived; its body is still to be read.

    The endpoint counts it in flight until `close()`, which the caller must await once the
    body is read or abandoned (closing the connection cancels the request upstream).
    """

    endpoint: EndpointState
    response: httpx.Response
    attempts: int  # how many endpoints were tried (1 = no retry)
    closed: bool = False

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.endpoint.inflight -= 1
            await self.response.aclose()


class Upstream:
    """Sends requests to endpoints, retrying before the first byte."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        *,
        timeout: httpx.Timeout = UPSTREAM_TIMEOUT,
        attempts: int = 3,
        on_success: Callable[[EndpointState], object] = lambda e: None,
        on_failure: Callable[[EndpointState], object] = lambda e: None,
    ) -> None:
        self.transport = transport
        self._timeout = timeout.as_dict()
        self._urls: dict[str, httpx.URL] = {}
        self.attempts = attempts
        self._on_success = on_success
        self._on_failure = on_failure
        self.retries = 0  # total extra attempts made (a metric)

    async def open(
        self,
        endpoints: Sequence[EndpointState],
        path: str,
        body: bytes,
        headers: dict[str, str],
    ) -> Opened:
        """POST `body` to `path` on the first endpoint that answers well enough.

        Returns the first non-retryable response (2xx, or a 4xx that is the request's fault,
        passed through to the client). Raises RouterError(503) when every attempt failed.
        """
        last: str = "no endpoint to try"
        tried = 0
        for endpoint in endpoints[: self.attempts]:
            if tried:
                self.retries += 1
                await asyncio.sleep(BACKOFF_S[min(tried, len(BACKOFF_S) - 1)])
            tried += 1
            endpoint.inflight += 1
            try:
                response = await self.transport.handle_async_request(
                    httpx.Request(
                        "POST",
                        self._url(endpoint.url + path),
                        content=body,
                        headers=headers,
                        extensions={"timeout": self._timeout},
                    )
                )
            except httpx.HTTPError as exc:
                endpoint.inflight -= 1
                self._on_failure(endpoint)
                last = f"{endpoint.url}: {type(exc).__name__}"
                continue
            except BaseException:
                endpoint.inflight -= 1
                raise
            if response.status_code in RETRYABLE_STATUSES:
                endpoint.inflight -= 1
                await response.aclose()
                self._on_failure(endpoint)
                last = f"{endpoint.url}: HTTP {response.status_code}"
                continue
            self._on_success(endpoint)
            return Opened(endpoint, response, tried)
        raise RouterError(
            503,
            f"no endpoint could serve the request after {tried} attempt(s); last: {last}",
            type="server_error",
            code="upstream_unavailable",
            headers={"Retry-After": "1"},
        )

    def _url(self, text: str) -> httpx.URL:
        """Parsed once per endpoint and path (parsing is a measurable share of a request)."""
        url = self._urls.get(text)
        if url is None:
            if len(self._urls) >= 4096:  # endpoints come and go: stay bounded
                self._urls.clear()
            url = self._urls[text] = httpx.URL(text)
        return url

    async def aclose(self) -> None:
        await self.transport.aclose()
