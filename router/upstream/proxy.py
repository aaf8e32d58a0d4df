"""The upstream half of the proxy: one shared aiohttp session, bounded retries, outliers.

Every upstream request goes through one `aiohttp.ClientSession` (one connection pool, created
on first use inside the event loop) with explicit timeouts (below) and pool limits
(`max_connections`), and no cookie jar: a gateway shared by tenants must not keep one tenant's
upstream cookies and send them with another tenant's request. aiohttp rather than httpx: on
the request path httpx's pool and objects cost several times more CPU per request
(`benchmarks/router_parts.py` compares the two).

`Upstream.open(...)` sends a request to the first endpoint of the picked order and returns
the upstream response with its headers read and its body not yet (streaming). A connection
error, a stream's head that does not come (below), or a 5xx/429 status is retried on the next
endpoint, with a short backoff, at most `attempts` times; nothing has reached the client yet,
so a retry is invisible to it. Once the body starts flowing the caller owns the response: a
failure then is mid-stream (`UpstreamError`) and is the caller's to report.

A stream's head comes at once (vLLM, SGLang and sim nodes send it before the first token), so
a stream whose head or next part does not come within `read_timeout_s` (300 s) is a hung
node's. A whole reply's head comes only once the node has generated all of it, which a long
reply on a busy node may take many minutes to do: waiting for it is bounded by
`whole_reply_timeout_s` instead (600 s, what the OpenAI and Anthropic SDKs wait, for the
request whichever endpoints it goes to), and past it the client gets 504 `upstream_timeout`
with no retry and nothing held against the node (it is busy, not broken; another endpoint
would do the same work again). A node that stops answering its metrics scrapes while it holds
a whole reply (three failed in a row, and no answer at all, not even an error status, for
`unresponsive_after_s`) is taken for hung: the wait ends, the node counts a failure and the
request goes to the next endpoint. A hosted API has no scrapes: its pool's `timeoutS`
bounds a stream's start, and `whole_reply_timeout_s` a whole reply.

Redirects are never followed: a 3xx is the endpoint's failure, like a 502. An endpoint that
sent the request elsewhere would send the prompt to a host no pool names. A whole reply larger
than `max_reply_bytes` (after decompression) is refused as it arrives (`ReplyTooLarge`), so a
misbehaving endpoint cannot make the router buffer gigabytes.

Whose fault a failure is decides whether it counts against the endpoint (outlier detection).
A connection error, a timeout, 429, 502, 503 or 504 says the endpoint is down or overloaded:
it counts at once. A 500 is an answer from a live endpoint, and the request itself may be
what broke it, so it counts only once another endpoint has served the same request; a request
that fails everywhere ejects nothing, and one tenant's poison requests cannot eject healthy
endpoints. The client's 503 names the tier and the last failure, never an endpoint's address.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp.payload import TOO_LARGE_BYTES_BODY
from yarl import URL

from tiergate.router.base.errors import RouterError
from tiergate.router.config import MAX_REPLY_BYTES, READ_TIMEOUT_S, WHOLE_REPLY_TIMEOUT_S
from tiergate.router.endpoints.hosted import HostedApi, KeyUnavailable
from tiergate.router.endpoints.state import CandidateSet, EndpointState

log = logging.getLogger("tiergate.router")

#: Statuses worth another endpoint: the endpoint is broken or overloaded, or (500) maybe the
#: request is the cause, which another endpoint's answer tells (module docstring).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
#: The request id the handler sends upstream, named in the log line of a request that failed.
REQUEST_ID_HEADER = "x-tiergate-request-id"
#: Backoff before the 2nd, 3rd, ... attempt (seconds); the last value repeats.
BACKOFF_S = (0.0, 0.02, 0.1)

#: Connecting is short (a dead endpoint must be retried elsewhere quickly), and so is waiting
#: for a pooled connection (`connect` covers both).
CONNECT_TIMEOUT_S, SOCK_CONNECT_TIMEOUT_S = 5.0, 2.0
#: A node whose scrapes have failed `UNRESPONSIVE_SCRAPES` times in a row, and that has answered
#: none (not even with an error status) for this long, is taken for hung by a whole reply
#: waiting on it.
UNRESPONSIVE_AFTER_S = 10.0
UNRESPONSIVE_SCRAPES = 3
#: How often a whole reply's wait looks at its node's scrapes.
WATCH_S = 1.0

#: Idle connections are dropped after this long: under uvicorn's (so vLLM's and the sim
#: node's) 5 s keep-alive, so a request never goes out on a connection the node is closing
#: (aiohttp does not resend a POST that meets a closed connection; it would count as the
#: endpoint's failure).
KEEPALIVE_S = 4.0

#: Upstream connections in use at once, at most (each proxied request holds one).
MAX_CONNECTIONS = 1024

#: The failures of a connection, as aiohttp raises them (timeouts are TimeoutError).
CONNECTION_ERRORS = (aiohttp.ClientError, TimeoutError)


class UpstreamUnavailable(RouterError):
    """Every attempt failed: the client's 503. `attempts` says how many endpoints were tried."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(
            503,
            message,
            type="server_error",
            code="upstream_unavailable",
            headers={"Retry-After": "1"},
        )
        self.attempts = attempts


class WholeReplyTimeout(RouterError):
    """A whole reply not begun within `whole_reply_timeout_s` on a node still answering, or
    a provider, or within a gateway's route timeout (`timeout_s` None): the client's 504, tried
    nowhere else (the work may be done, and paid for)."""

    def __init__(self, tier: str, timeout_s: float | None, attempts: int) -> None:
        within = "in the gateway's time" if timeout_s is None else f"within {timeout_s:g} s"
        super().__init__(
            504,
            f"the {tier} tier's endpoint did not finish the reply {within}; "
            'ask for a stream ("stream": true) to receive a long reply as it is generated',
            type="server_error",
            code="upstream_timeout",
        )
        self.attempts = attempts


def _payload(body: bytes) -> bytes | io.BytesIO:
    """A request body as aiohttp should send it: a large one (past a MiB; bodies go up to
    router.maxBodyBytes) from a file-like object, written in pieces, not as one buffer (aiohttp
    warns that one such write may hold the event loop). A new one for each attempt."""
    return io.BytesIO(body) if len(body) > TOO_LARGE_BYTES_BODY else body


class _Unresponsive(Exception):
    """The node holding a whole reply stopped answering its scrapes."""


class UpstreamError(Exception):
    """The upstream connection failed after the response started (reset, timeout, bad framing)."""


class ReplyTooLarge(UpstreamError):
    """A whole reply went past `max_reply_bytes`; the rest of it is left unread."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


@dataclass(slots=True)
class Opened:
    """An upstream response whose headers have arrived; its body is still to be read.

    The endpoint counts it in flight until `close()`, which the caller must await once the
    body is read or abandoned: an unread body closes the connection, which cancels the
    request upstream; a fully read one returns the connection to the pool.
    """

    endpoint: EndpointState
    response: aiohttp.ClientResponse
    attempts: int  # how many endpoints were tried (1 = no retry)
    max_reply_bytes: int = MAX_REPLY_BYTES
    # Between two parts of the body, when the connection's own timeout does not bound it (a
    # whole reply's: its wait for the head had none).
    read_timeout_s: float | None = None
    closed: bool = False

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def content_type(self) -> str:
        return self.response.headers.get("content-type", "")

    async def read(self) -> bytes:
        """The whole body; UpstreamError if the connection fails while reading it, and
        ReplyTooLarge past `max_reply_bytes` (counted as decoded: a compressed reply too)."""
        parts: list[bytes] = []
        size = 0
        content = self.response.content
        try:
            while True:
                async with asyncio.timeout(self.read_timeout_s):
                    chunk = await content.readany()
                if not chunk:
                    return b"".join(parts)
                size += len(chunk)
                if size > self.max_reply_bytes:
                    raise ReplyTooLarge(self.max_reply_bytes)
                parts.append(chunk)
        except CONNECTION_ERRORS as exc:
            raise UpstreamError(type(exc).__name__) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; UpstreamError if the connection fails on the way."""
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        except CONNECTION_ERRORS as exc:
            raise UpstreamError(type(exc).__name__) from exc

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.endpoint.inflight -= 1
            self.response.release()


class Upstream:
    """Sends requests to endpoints, retrying before the first byte."""

    def __init__(
        self,
        *,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
        whole_reply_timeout_s: float = WHOLE_REPLY_TIMEOUT_S,
        unresponsive_after_s: float = UNRESPONSIVE_AFTER_S,
        attempts: int = 3,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        on_success: Callable[[EndpointState], object] = lambda e: None,
        on_failure: Callable[[EndpointState], object] = lambda e: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        read_timeout_s: until a stream's head, and between two parts of any reply.
        whole_reply_timeout_s: until a whole reply's head, from a node still answering.
        unresponsive_after_s: a node holding a whole reply whose scrapes have failed
            `UNRESPONSIVE_SCRAPES` times in a row, and which has answered none for this long
            (by `clock`, the scraper's), is taken for hung.
        """
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.whole_reply_timeout_s = whole_reply_timeout_s
        self.unresponsive_after_s = unresponsive_after_s
        self.clock = clock
        self.timeout = self._timeout(read_timeout_s)
        # A whole reply's head has no read timeout: the wait is bounded by `_whole_head`.
        self._whole_timeout = self._timeout(None)
        self.attempts = attempts
        self.max_reply_bytes = max_reply_bytes
        self._on_success = on_success
        self._on_failure = on_failure
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self.retries = 0  # total extra attempts made (a metric)
        self.refusal: RouterError | None = None  # the router's own port answers for itself

    def _client(self) -> aiohttp.ClientSession:
        """The shared session, made on first use (aiohttp needs the running event loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, keepalive_timeout=KEEPALIVE_S
                ),
                timeout=self.timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                # Compression is not asked for (a node that compresses anyway is decoded).
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    def usable(self, endpoints: Sequence[EndpointState]) -> Sequence[EndpointState]:
        """The candidates, all of which the proxy reaches (hosted APIs too), but a provider
        that has as many requests open as its pool's `maxConcurrentRequests`: the tier's other
        endpoints serve meanwhile (an engine queues past its batch cap; a provider answers
        429 and is ejected)."""
        if isinstance(endpoints, CandidateSet):
            return endpoints.without_full_providers()
        return endpoints

    async def open(
        self,
        endpoints: Sequence[EndpointState],
        path: str,
        body: bytes,
        headers: dict[str, str],
        hosted_body: Callable[[HostedApi], bytes] | None = None,
        *,
        whole: bool = False,
    ) -> Opened:
        """POST `body` to `path` on the first endpoint that answers well enough; `whole`: the
        reply is not streamed, so a node sends its head only once it has generated it all
        (module docstring).

        A hosted API's endpoint is sent `hosted_body(api)` instead (the provider's model name),
        with the provider's key and none of `headers` (`HostedApi.headers`), at its own URL and
        timeout. Returns the first non-retryable response (2xx, or a 4xx that is the request's
        fault, passed through to the client; a 401 or 403 refuses the router, not the request,
        and counts as the endpoint's failure). Raises UpstreamUnavailable (a 503) when
        every attempt failed; its message names no endpoint (the log line
        `upstream_unavailable` does).
        """
        session = self._client()
        failures: list[tuple[EndpointState, str]] = []
        answered_500: list[EndpointState] = []  # not held against them unless another serves
        passed_over = 0  # providers filled by other requests since the pick: not attempts
        # One bound for a whole reply, whichever endpoints it goes to.
        deadline = asyncio.get_running_loop().time() + self.whole_reply_timeout_s
        for endpoint in endpoints:
            if len(failures) >= self.attempts:
                break
            hosted = endpoint.hosted
            if hosted is not None and hosted.full(endpoint.inflight):
                passed_over += 1  # held against nothing: the next endpoint's turn
                continue
            if failures:
                self.retries += 1
                await asyncio.sleep(BACKOFF_S[min(len(failures), len(BACKOFF_S) - 1)])
                if hosted is not None and hosted.full(endpoint.inflight):  # filled meanwhile
                    passed_over += 1
                    continue
            # A whole reply begins once it is generated, from a node or a provider alike:
            # `_whole_head` waits for it up to the deadline (a provider is never scraped, so
            # only a node is ever judged unresponsive).
            watched = whole
            url, data, sent = endpoint.url + path, body, headers
            timeout = self._whole_timeout if watched else self.timeout
            if hosted is not None:
                try:
                    sent = hosted.headers()
                except KeyUnavailable as exc:
                    log.warning("event=provider_key_unavailable pool=%s problem=%s",
                                endpoint.pool, exc)  # fmt: skip
                    self._on_failure(endpoint)
                    failures.append((endpoint, "the provider's API key is unavailable"))
                    continue
                url = hosted.url(path)
                if not watched:  # a stream: its first part and every next within timeoutS
                    timeout = self._hosted_timeout(hosted.timeout_s)
                data = hosted_body(hosted) if hosted_body is not None else body
            endpoint.inflight += 1
            try:
                post = session.post(
                    self._url(url), data=_payload(data), headers=sent, timeout=timeout,
                    allow_redirects=False,
                )  # fmt: skip
                response = await (
                    self._whole_head(post, endpoint, headers, len(failures) + 1, deadline)
                    if watched
                    else post
                )
            except (*CONNECTION_ERRORS, ValueError) as exc:  # ValueError: a URL it cannot use
                endpoint.inflight -= 1
                self._on_failure(endpoint)
                failures.append((endpoint, _failure(exc)))
                continue
            except _Unresponsive:
                endpoint.inflight -= 1
                self._on_failure(endpoint)
                failures.append((endpoint, "the node stopped answering"))
                continue
            except BaseException:
                endpoint.inflight -= 1
                raise
            # A node is sent no client's key: its 401 or 403 refuses the router (a node that
            # wants a key it is not given, a provider that refuses the pool's), not the request.
            refused_key = response.status in (401, 403)
            redirected = 300 <= response.status < 400
            # A provider's every 5xx is its own failure (a CDN in front of it answers 520-524).
            unwell = response.status in RETRYABLE_STATUSES or (
                hosted is not None and response.status >= 500
            )
            if unwell or refused_key or redirected:
                endpoint.inflight -= 1
                response.close()
                if refused_key:
                    if hosted is not None:
                        log.warning("event=provider_refused_key pool=%s status=%d",
                                    endpoint.pool, response.status)  # fmt: skip
                    else:
                        log.warning("event=endpoint_refused_router pool=%s endpoint=%s "
                                    "status=%d (does it want an API key?)",
                                    endpoint.pool, endpoint.url, response.status)  # fmt: skip
                    self._on_failure(endpoint)
                elif redirected:  # where it points is not logged: it may carry a secret
                    log.warning("event=upstream_redirect pool=%s endpoint=%s status=%d",
                                endpoint.pool, endpoint.url, response.status)  # fmt: skip
                    self._on_failure(endpoint)
                elif response.status == 500:
                    answered_500.append(endpoint)
                else:
                    self._on_failure(endpoint)
                why = f"HTTP {response.status}" + (" (redirects are not followed)" * redirected)
                failures.append((endpoint, why))
                continue
            if response.status < 300:
                for failed in answered_500:  # the request was fine: those endpoints were not
                    self._on_failure(failed)
            self._on_success(endpoint)
            read_s = self.read_timeout_s if watched else None
            return Opened(endpoint, response, len(failures) + 1, self.max_reply_bytes, read_s)
        raise self._unavailable(endpoints, failures, headers, passed_over)

    async def _whole_head(
        self,
        post: Awaitable[aiohttp.ClientResponse],
        endpoint: EndpointState,
        headers: dict[str, str],
        attempt: int,
        deadline: float,
    ) -> aiohttp.ClientResponse:
        """The head of a whole reply from a node, awaited until `deadline` (the event loop's
        time; WholeReplyTimeout past it) while the node answers its scrapes (_Unresponsive
        once it has not for `unresponsive_after_s`). The request is cancelled (its connection
        closed, which stops the node's work) when the wait ends without the head."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(post)
        handed = False
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    log.warning(
                        "event=whole_reply_timeout request_id=%s pool=%s endpoint=%s after_s=%g",
                        headers.get(REQUEST_ID_HEADER, "-"), endpoint.pool, endpoint.url,
                        self.whole_reply_timeout_s,
                    )  # fmt: skip
                    raise WholeReplyTimeout(endpoint.tier, self.whole_reply_timeout_s, attempt)
                await asyncio.wait((task,), timeout=min(WATCH_S, left))
                if task.done():
                    handed = True
                    return task.result()
                if self._unresponsive(endpoint):
                    log.warning(
                        "event=node_unresponsive request_id=%s pool=%s endpoint=%s "
                        "failed_scrapes=%d", headers.get(REQUEST_ID_HEADER, "-"),
                        endpoint.pool, endpoint.url, endpoint.scrape_failures,
                    )  # fmt: skip
                    raise _Unresponsive
        finally:
            if not handed:
                # A head that comes anyway (as the wait ends, or past a second cancellation
                # while this waits below) is closed, whenever it comes: nobody reads it.
                task.add_done_callback(_close_unread)
                task.cancel()  # closes the connection: the node stops generating
                await asyncio.wait((task,))  # not `await task`: its CancelledError is not ours

    def _unresponsive(self, endpoint: EndpointState) -> bool:
        """Whether `endpoint` has stopped answering its scrapes: its last scrapes failed and
        it has answered none (not even with an error status) for `unresponsive_after_s`. One
        never scraped, or no longer scraped (out of the view), is not judged."""
        answered = endpoint.answered_at_s
        return (
            answered is not None
            and endpoint.scrape_failures >= UNRESPONSIVE_SCRAPES
            and self.clock() - answered >= self.unresponsive_after_s
        )

    @staticmethod
    def _unavailable(
        endpoints: Sequence[EndpointState],
        failures: list[tuple[EndpointState, str]],
        headers: dict[str, str],
        passed_over: int = 0,
    ) -> UpstreamUnavailable:
        """The client's 503 (tier, attempts, the last failure: never an endpoint's address)
        and the operator's log line (every endpoint tried, and how it failed)."""
        tier = endpoints[0].tier if endpoints else "requested"
        last = (
            failures[-1][1] if failures
            else "every provider picked had as many requests open as its pool allows "
            "(maxConcurrentRequests)" if passed_over
            else "no endpoint to try"
        )  # fmt: skip
        log.warning(
            'event=upstream_unavailable request_id=%s tier=%s attempts=%d endpoints=%s errors="%s"',
            headers.get(REQUEST_ID_HEADER, "-"),
            tier,
            len(failures),
            ",".join(e.url for e, _ in failures) or "-",
            "; ".join(why for _, why in failures),
        )
        return UpstreamUnavailable(
            f"no endpoint of the {tier} tier could serve the request after "
            f"{len(failures)} attempt(s); last: {last}",
            len(failures),
        )

    def _hosted_timeout(self, read_s: float) -> aiohttp.ClientTimeout:
        """The upstream timeouts, with a hosted API's own for its reply (cached per value)."""
        timeout = self._timeouts.get(read_s)
        if timeout is None:
            timeout = self._timeouts[read_s] = self._timeout(read_s)
        return timeout

    @staticmethod
    def _timeout(read_s: float | None) -> aiohttp.ClientTimeout:
        """Connecting's timeouts, and `read_s` to read (None: not bounded here). No total:
        streams are long."""
        return aiohttp.ClientTimeout(
            total=None,
            connect=CONNECT_TIMEOUT_S,
            sock_connect=SOCK_CONNECT_TIMEOUT_S,
            sock_read=read_s,
        )

    def failed(self, endpoint: EndpointState) -> None:
        """An endpoint's response failed after it started (its stream broke before the first
        token): the endpoint's failure, for outlier detection."""
        self._on_failure(endpoint)

    def _url(self, text: str) -> URL:
        """Parsed once per endpoint and path (parsing is a measurable share of a request)."""
        url = self._urls.get(text)
        if url is None:
            if len(self._urls) >= 4096:  # endpoints come and go: stay bounded
                self._urls.clear()
            url = self._urls[text] = URL(text)
        return url

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _close_unread(task: asyncio.Future[aiohttp.ClientResponse]) -> None:
    """Close the response `task` brought, if any (its exception, if any, is retrieved)."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def _failure(exc: BaseException) -> str:
    """How a connection failed, in words a client may read (no address)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.InvalidURL) or not isinstance(exc, aiohttp.ClientError):
        return "unusable endpoint address"  # yarl's ValueError, or aiohttp's
    return f"connection failed ({type(exc).__name__})"
