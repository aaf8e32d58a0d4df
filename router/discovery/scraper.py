"""Scraping each endpoint's Prometheus metrics into its `EndpointState`.

The `Scraper` fetches `/metrics` from each current endpoint once per `interval_s` (stretched
for big fleets to bound the scrape rate), spread evenly over the interval by a
`ScrapeSchedule` rather than in one burst, so the request path never waits behind a whole
round; each request has a timeout shorter than the interval. It writes running / waiting /
KV usage into the states in place. A slow or silent endpoint holds up nothing but itself. A
failed scrape keeps the old values: `scraped_at_s` stays at the last success (so their age
shows) and `scrape_failures` counts consecutive failures; after a few, the figures are dropped.

Parsing reads only the three figures routing needs, not the histograms that make up most of
a vLLM exposition. They are read under vLLM's names (what sim nodes expose too), or else
SGLang's (`sglang:`) or llama.cpp's (`llamacpp:`): an engine the router did not write is
weighed by its load as well; a figure no engine names stays unknown. Fetching
(`MetricsFetcher`) goes through an aiohttp session of its own, apart from the proxy's pool,
keeping connections alive between scrapes (`benchmarks/router_parts.py` measures a scrape's
cost).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tiergate.pools.engine_metrics import METRIC_NAMES, VLLM
from tiergate.router.discovery.scrape_schedule import ScrapeSchedule
from tiergate.router.endpoints.state import EndpointState

__all__ = [
    "EndpointMetrics",
    "Fetch",
    "MetricsFetcher",
    "MetricsParseError",
    "ScrapeError",
    "ScrapeRound",
    "Scraper",
    "parse_vllm_metrics",
]

log = logging.getLogger("tiergate.router.discovery.scraper")

RUNNING, WAITING = VLLM.running, VLLM.waiting
#: Each figure's names, the first one present wins: vLLM's, then SGLang's, then llama.cpp's.
RUNNING_NAMES = tuple(engine.running for engine in METRIC_NAMES)
WAITING_NAMES = tuple(engine.waiting for engine in METRIC_NAMES)
KV_USAGE_NAMES = tuple(name for engine in METRIC_NAMES for name in engine.kv_usage)
_WANTED = (*RUNNING_NAMES, *WAITING_NAMES, *KV_USAGE_NAMES)

#: Consecutive failed scrapes after which an endpoint's last figures are dropped (unknown): a
#: blip keeps them, an endpoint whose metrics stay unreadable stops being judged by them.
FORGET_AFTER_FAILURES = 3

# One sample line of the text format: name, optional {labels}, value, optional timestamp.
_SAMPLE_LINE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?[ \t]+\S+([ \t]+\S+)?[ \t]*")


class MetricsParseError(ValueError):
    """The text is not a Prometheus exposition (an HTML error page, JSON, binary...)."""


class ScrapeError(Exception):
    """No metrics page came back: refused, timed out, a bad status, too big. `answered`: the
    endpoint did answer (a status, a body), so it is up, if not with metrics."""

    def __init__(self, message: str, *, answered: bool = False) -> None:
        super().__init__(message)
        self.answered = answered


#: GET `url` within `timeout_s` and return the body as text, or raise ScrapeError.
Fetch = Callable[[str, float, int], Awaitable[str]]


class MetricsFetcher:
    """The scraper's HTTP client: one aiohttp session (made on first use, in the event loop)
    with at most `max_connections` in flight and idle connections kept for the next round:
    `keepalive_s`, under a vLLM's own keep-alive (uvicorn's 5 s), so that a scrape never goes
    out on a connection in the instant the engine closes it (with `scrapeIntervalS` near 5 s,
    a round now and then would)."""

    def __init__(self, *, max_connections: int = 32, keepalive_s: float = 4.0) -> None:
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, url: str, timeout_s: float, max_bytes: int) -> str:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, keepalive_timeout=self.keepalive_s
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                if response.status != 200:
                    raise ScrapeError(f"HTTP {response.status}", answered=True)
                body = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > max_bytes:
                        raise ScrapeError(f"reply larger than {max_bytes} bytes", answered=True)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ScrapeError(_describe(exc)) from exc
        return body.decode("utf-8", "replace")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """What routing reads from one scrape; None for a metric the endpoint did not expose."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1


def parse_vllm_metrics(text: str) -> EndpointMetrics:
    """The routing metrics of a Prometheus text exposition.

    Several series of one metric (several `model_name` labels, or data-parallel engines) are
    summed for the request counts; KV usage is their mean, since summing the fill fractions of
    separate caches means nothing. Missing metrics are None. Raises MetricsParseError when the
    text is not an exposition at all.
    """
    kept: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in _WANTED:
                kept.append(line)
            continue
        if not _SAMPLE_LINE.fullmatch(line):
            raise MetricsParseError(f"not a Prometheus exposition line: {line[:80]!r}")
        if line.startswith(_WANTED):
            kept.append(line)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    try:
        for family in text_string_to_metric_families("\n".join(kept) + "\n"):
            for sample in family.samples:
                if sample.name in _WANTED and math.isfinite(sample.value):
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                    counts[sample.name] = counts.get(sample.name, 0) + 1
    except ValueError as exc:
        raise MetricsParseError(f"bad Prometheus exposition: {exc}") from None
    kv_name = next((name for name in KV_USAGE_NAMES if name in sums), None)
    kv_usage = None
    if kv_name is not None:
        kv_usage = min(max(sums[kv_name] / counts[kv_name], 0.0), 1.0)
    running = next((sums[name] for name in RUNNING_NAMES if name in sums), None)
    waiting = next((sums[name] for name in WAITING_NAMES if name in sums), None)
    return EndpointMetrics(
        running=None if running is None else max(running, 0.0),
        waiting=None if waiting is None else max(waiting, 0.0),
        kv_usage=kv_usage,
    )


@dataclass(frozen=True, slots=True)
class ScrapeRound:
    """The outcome of one `scrape_once`, or of one pass of the background schedule."""

    scraped: int
    failed: int


@dataclass(slots=True)
class _Pass:
    """The background scrapes of one pass over the ring; its round ends once all have."""

    pending: int = 0
    scraped: int = 0
    failed: int = 0
    started: bool = False  # every scrape of the pass has been started


class Scraper:
    """Scrapes every endpoint's metrics each interval and updates their states in place."""

    def __init__(
        self,
        endpoints: Callable[[], Sequence[EndpointState]],
        fetch: Fetch,
        *,
        clock: Callable[[], float],
        interval_s: float = 1.0,
        max_scrapes_per_s: float = 50.0,
        timeout_s: float | None = None,
        max_concurrency: int = 64,
        max_body_bytes: int = 1 << 20,
        path: str = "/metrics",
        on_round: Callable[[ScrapeRound], object] | None = None,
        min_tick_s: float = 0.01,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """
        endpoints: returns the current endpoints (called each tick, so discovery may change
            them at any time).
        fetch: gets one metrics page (a `MetricsFetcher`); the scraper never closes it.
        clock: the router's clock (seconds); stamps `scraped_at_s` and paces the scrapes.
        timeout_s: per request; default 80% of the interval, so a pass ends before the next.
        max_concurrency: requests in flight at once, so scraping a big fleet never takes every
            connection of a shared client's pool.
        max_body_bytes: a larger reply is a failure (a misbehaving endpoint cannot make the
            router buffer gigabytes).
        on_round: called after each round (each pass over every endpoint, once its scrapes
            have ended) with its outcome, to work out once per round what would otherwise be
            read from every endpoint per request (tier saturation).
        min_tick_s: background scrapes start at most this often (at high rates a tick takes
            several endpoints).
        sleep: waits between ticks; tests pass one that advances a fake clock.
        """
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.endpoints = endpoints
        self.fetch = fetch
        self.clock = clock
        self.interval_s = interval_s
        self.max_scrapes_per_s = max_scrapes_per_s
        self.timeout_s = timeout_s if timeout_s is not None else 0.8 * interval_s
        self.max_body_bytes = max_body_bytes
        self.path = path
        self.on_round = on_round
        self.sleep = sleep
        self.rounds = 0
        self.schedule = ScrapeSchedule(
            self._period_s, min_tick_s=min(min_tick_s, interval_s), max_tick_s=interval_s
        )
        self._limit = asyncio.Semaphore(max_concurrency)
        self._task: asyncio.Task[None] | None = None
        # Background scrapes in flight, by id() of their endpoint (which each task holds).
        self._inflight: dict[int, asyncio.Task[bool]] = {}
        self._pass = _Pass()  # the pass the schedule is in

    async def scrape_once(self) -> ScrapeRound:
        """Scrape every current endpoint once, concurrently."""
        endpoints = list(self.endpoints())
        results = await asyncio.gather(*(self._scrape(ep) for ep in endpoints))
        ok = sum(results)
        return self._end_round(ScrapeRound(scraped=ok, failed=len(results) - ok))

    def start(self) -> None:
        """Scrape in the background, each endpoint every `round_interval_s()`, until `stop()`."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="tiergate-scraper")

    async def stop(self) -> None:
        """Cancel the background scraping and wait for it to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            # Re-raise only if *we* are being cancelled, not because we cancelled the task.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    def round_interval_s(self) -> float:
        """Time between two scrapes of one endpoint: `interval_s`, stretched with the fleet so
        that scraping stays a bounded share of the router's CPU (its own in-flight counts
        cover the gaps)."""
        return self._period_s(len(self.endpoints()))

    def _period_s(self, endpoint_count: int) -> float:
        return max(self.interval_s, endpoint_count / self.max_scrapes_per_s)

    async def _run(self) -> None:
        try:
            while True:
                try:
                    wait_s = self._tick()
                except Exception:  # a bug here must not stop scraping for the router's lifetime
                    log.exception("event=scrape_tick_failed")
                    wait_s = self.interval_s
                await self.sleep(wait_s)
        finally:
            # The passes these scrapes belong to never end: no round is reported for them.
            inflight = list(self._inflight.values())
            for task in inflight:
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)
            self._pass = _Pass()

    def _tick(self) -> float:
        """Start this tick's scrapes without waiting for them: one slow endpoint must not hold
        up the others'. A pass's round ends when the last of its scrapes does."""
        tick = self.schedule.tick(self.clock(), self.endpoints())
        this_pass = self._pass
        for ep in tick.endpoints:
            if id(ep) in self._inflight:
                # Its previous scrape is still waiting (an endpoint slower than its period):
                # one at a time, or a silent endpoint would pile up requests and connections.
                continue
            task = asyncio.create_task(self._scrape(ep))
            self._inflight[id(ep)] = task
            this_pass.pending += 1
            task.add_done_callback(partial(self._scraped, id(ep), this_pass))
        if tick.pass_done:
            this_pass.started = True
            self._pass = _Pass()
            self._end_pass_if_done(this_pass)
        return tick.wait_s

    def _scraped(self, key: int, of_pass: _Pass, task: asyncio.Task[bool]) -> None:
        del self._inflight[key]
        if task.cancelled():  # stopping
            return
        of_pass.pending -= 1
        exc = task.exception()
        if exc is not None:
            log.error("event=scrape_bug", exc_info=exc)
        if exc is None and task.result():
            of_pass.scraped += 1
        else:
            of_pass.failed += 1
        self._end_pass_if_done(of_pass)

    def _end_pass_if_done(self, of_pass: _Pass) -> None:
        if of_pass.started and not of_pass.pending:
            try:
                self._end_round(ScrapeRound(scraped=of_pass.scraped, failed=of_pass.failed))
            except Exception:  # in a task's done callback: nobody else would see it
                log.exception("event=scrape_round_hook_failed")

    def _end_round(self, outcome: ScrapeRound) -> ScrapeRound:
        self.rounds += 1
        if self.on_round is not None:
            self.on_round(outcome)
        return outcome

    async def _scrape(self, ep: EndpointState) -> bool:
        url = ep.url.rstrip("/") + self.path
        try:
            async with self._limit:
                text = await self.fetch(url, self.timeout_s, self.max_body_bytes)
            metrics = parse_vllm_metrics(text)
        except (ScrapeError, MetricsParseError) as exc:
            ep.scrape_failures += 1
            if isinstance(exc, MetricsParseError) or exc.answered:
                ep.answered_at_s = self.clock()
            if ep.scrape_failures == 1:  # log transitions, not every failed round
                log.warning(
                    "event=scrape_failed endpoint=%s pool=%s error=%r",
                    ep.url,
                    ep.pool,
                    _describe(exc),
                )
            elif ep.scrape_failures == FORGET_AFTER_FAILURES:
                # Figures this old would steer picking and pin a tier "saturated" (shedding
                # flex, moving `auto`) for as long as the endpoint's metrics stay unreadable.
                ep.running = ep.waiting = ep.kv_usage = None
                log.warning("event=scrape_figures_dropped endpoint=%s pool=%s failures=%d",
                            ep.url, ep.pool, ep.scrape_failures)  # fmt: skip
            return False
        if ep.scrape_failures:
            log.info("event=scrape_recovered endpoint=%s failures=%d", ep.url, ep.scrape_failures)
        ep.running, ep.waiting, ep.kv_usage = metrics.running, metrics.waiting, metrics.kv_usage
        ep.scraped_at_s = ep.answered_at_s = self.clock()
        ep.scrape_failures = 0
        return True


def _describe(exc: BaseException) -> str:
    # Timeouts have empty messages; the class name says what happened.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
