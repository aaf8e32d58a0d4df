"""The upstream half of the proxy: one shared httpx client, bounded retries, outliers.

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

from .errors import RouterError
from .state import EndpointState

#: Statuses worth another endpoint: the endpoint is broken or overloaded, not the request.
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Backoff before the 2nd, 3rd, ... attempt (seconds); the last value repeats.
BACKOFF_S = (0.0, 0.02, 0.1)


def default_client(*, max_connections: int = 1024) -> httpx.AsyncClient:
    """The one client the router uses for every upstream request.

    Explicit timeouts: connecting and waiting for a pooled connection are short (a dead
    endpoint must be retried elsewhere quickly); reading is long (a stream may pause while a
    busy node prefills a long prompt).
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=2.0, read=300.0, write=30.0, pool=5.0),
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
        ),
        follow_redirects=False,
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
        client: httpx.AsyncClient,
        *,
        attempts: int = 3,
        on_success: Callable[[EndpointState], object] = lambda e: None,
        on_failure: Callable[[EndpointState], object] = lambda e: None,
    ) -> None:
        self.client = client
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
                request = self.client.build_request(
                    "POST", endpoint.url + path, content=body, headers=headers
                )
                response = await self.client.send(request, stream=True)
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
