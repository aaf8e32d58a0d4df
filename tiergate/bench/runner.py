"""Running a bench: per caller (one, or each `--tenants` entry) a client with its key and
`concurrency` workers in a closed loop; the planned requests; a report.

`run_bench` is the whole run as a coroutine (the CLI only parses flags and prints); tests
pass a `transport` to drive it in-process, or point it at a real socket, and may pass the
`clock` of an event loop of virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import httpx

from tiergate.bench.client import send_request
from tiergate.bench.discovery import ServedModel, choose_models, discover_models
from tiergate.bench.errors import BenchError, BenchInterrupted
from tiergate.bench.pacing import Schedule, pause_after_429
from tiergate.bench.results import RequestResult
from tiergate.bench.stats import BenchReport, RunInfo, SloTargets, summarize
from tiergate.bench.tenants import BenchTenant
from tiergate.bench.workload import Workload
from tiergate.common.connection_limits import CLIENT_KEEPALIVE_S

T = TypeVar("T")

__all__ = ["BenchSettings", "normalize_url", "run_bench"]

#: Connecting should be quick even when replies are slow.
_CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """Everything a run needs besides the workload.

    `requests` is the total of the run (None: as many as `duration_s` allows). With `tenants`,
    each tenant's key and concurrency are used instead of `api_key` and `concurrency`.
    """

    url: str
    requests: int | None
    concurrency: int
    workload: Workload
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 120.0
    duration_s: float | None = None
    tenants: tuple[BenchTenant, ...] = ()
    pause_s: float = 0.0  # what each worker waits after a reply before its next request
    slo: SloTargets | None = None  # what each tier's SLO attainment is counted against

    def __post_init__(self) -> None:
        if self.requests is None and self.duration_s is None:
            raise BenchError("a run needs a number of requests or a duration")


@dataclass(frozen=True, slots=True)
class _Caller:
    """Who sends a share of the load: a tenant, or (name None) the run's single caller."""

    name: str | None
    api_key: str | None
    concurrency: int


def normalize_url(url: str) -> str:
    """`url` without a trailing slash or `/v1` (accepted as OpenAI clients' base URL)."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (ValueError when out of range or not a number)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        usable = False
    if not usable:
        raise BenchError(
            f"--router: expected an http(s) URL such as http://127.0.0.1:8080, got {url!r}"
        )
    base = url.strip().rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


async def run_bench(
    settings: BenchSettings,
    *,
    on_result: Callable[[RequestResult], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], float] = time.perf_counter,
    stop: asyncio.Event | None = None,
) -> BenchReport:
    """Run the bench and summarize it. Raises BenchError if the server is unreachable.

    A worker waits `settings.pause_s` after each reply, or the Retry-After of a 429 if longer
    (`pacing.pause_after_429`), before sending again. `stop` set (Ctrl-C): no request is sent
    after it, those in flight are abandoned, and the report covers the requests that finished,
    marked as interrupted.
    """
    url = normalize_url(settings.url)
    callers = _callers(settings)
    workload = settings.workload
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(_client(url, caller, settings, transport))
            for caller in callers
        ]
        served = await _unless_stopped(_discover(url, callers, clients), stop)
        models = choose_models(workload.mix, settings.model, served, url)
        planned = workload.stream()
        if settings.requests is not None:
            planned = itertools.islice(planned, settings.requests)
        results: list[RequestResult] = []
        start = last_reply_at = clock()
        schedule = Schedule(planned, clock, duration_s=settings.duration_s)

        async def worker(caller: _Caller, client: httpx.AsyncClient) -> None:
            nonlocal last_reply_at
            while (request := schedule.next_request()) is not None:
                sent_at = time.time()
                result = await send_request(
                    client,
                    workload,
                    request,
                    models[request.tier],
                    timeout_s=settings.timeout_s,
                    clock=clock,
                )
                result.tenant = caller.name
                result.sent_at = sent_at
                results.append(result)
                last_reply_at = max(last_reply_at, clock())
                if on_result is not None:
                    on_result(result)
                wanted_s = settings.pause_s
                if result.status == 429:  # a closed loop must not spin on a full queue
                    wanted_s = max(wanted_s, pause_after_429(result.retry_after_s))
                pause_s = schedule.pause_s(wanted_s)
                if pause_s > 0:
                    await asyncio.sleep(pause_s)

        async with asyncio.TaskGroup() as group:
            workers = [
                group.create_task(worker(caller, client))
                for caller, client in zip(callers, clients, strict=True)
                for _ in range(caller.concurrency)
            ]
            if stop is not None:
                group.create_task(_cancel_on(stop, workers))
        # To the last reply, not to the last worker's end: one still pausing after a 429 when
        # the others took the last requests sends nothing more.
        wall_s = last_reply_at - start

    run = RunInfo(
        interrupted=stop is not None and stop.is_set(),
        url=url,
        requests=settings.requests,
        duration_s=settings.duration_s,
        concurrency=sum(caller.concurrency for caller in callers),
        tenants={t.name: t.concurrency for t in settings.tenants},
        mix=workload.mix,
        models=models,
        input_tokens=workload.input_tokens,
        max_tokens=workload.max_tokens,
        min_max_tokens=workload.min_max_tokens,
        pause_s=settings.pause_s,
        tools_fraction=workload.tools_fraction,
        seed=workload.seed,
        slo=settings.slo,
    )
    results.sort(key=lambda r: r.index)
    return summarize(results, run, wall_s)


async def _discover(
    url: str, callers: list[_Caller], clients: list[httpx.AsyncClient]
) -> list[ServedModel] | None:
    """The first caller's model list, every caller's key checked on the way (a refused one
    stops the run before any load is sent, naming its tenant)."""
    served: list[ServedModel] | None = None
    for index, (caller, client) in enumerate(zip(callers, clients, strict=True)):
        hint = None if caller.name is None else f"check the key of tenant {caller.name!r}"
        listed = await discover_models(client, url, key_hint=hint)
        served = listed if index == 0 else served
    return served


def _callers(settings: BenchSettings) -> list[_Caller]:
    """Who sends the load: each tenant, or the one caller of --api-key and --concurrency."""
    if settings.tenants:
        return [_Caller(t.name, t.api_key, t.concurrency) for t in settings.tenants]
    # No more workers than requests: the others would have nothing to send.
    concurrency = min(settings.concurrency, settings.requests or settings.concurrency)
    return [_Caller(None, settings.api_key, concurrency)]


def _client(
    url: str,
    caller: _Caller,
    settings: BenchSettings,
    transport: httpx.AsyncBaseTransport | None,
) -> httpx.AsyncClient:
    """A caller's client: its key, a connection per worker."""
    headers = {"authorization": f"Bearer {caller.api_key}"} if caller.api_key else {}
    limits = httpx.Limits(
        max_connections=caller.concurrency,
        max_keepalive_connections=caller.concurrency,
        keepalive_expiry=CLIENT_KEEPALIVE_S,
    )
    timeout = httpx.Timeout(settings.timeout_s, connect=min(_CONNECT_TIMEOUT_S, settings.timeout_s))
    return httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=timeout, transport=transport
    )


async def _cancel_on(stop: asyncio.Event, workers: list[asyncio.Task[None]]) -> None:
    """Cancel `workers` once `stop` is set; return when they are all done either way (a
    cancelled child does not fail its TaskGroup)."""
    finished = asyncio.ensure_future(asyncio.wait(workers))  # cancelling it leaves them be
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([finished, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():
            for worker in workers:
                worker.cancel()
    finally:
        finished.cancel()
        stopped.cancel()


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event | None) -> T:
    """`work`'s result; BenchInterrupted (and `work` cancelled) if `stop` is set first."""
    task = asyncio.ensure_future(work)
    if stop is None:
        return await task
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise BenchInterrupted("interrupted before any request was sent")
    return task.result()
