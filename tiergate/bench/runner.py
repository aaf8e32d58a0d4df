"""Running a bench: one shared client, `concurrency` workers, the planned requests, a report.

`run_bench` is the whole run as a coroutine (the CLI only parses flags and prints); tests
pass a `transport` to drive it in-process, or point it at a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import httpx

from tiergate.bench.client import send_request
from tiergate.bench.discovery import choose_models, discover_models
from tiergate.bench.errors import BenchError, BenchInterrupted
from tiergate.bench.results import RequestResult
from tiergate.bench.stats import BenchReport, RunInfo, summarize
from tiergate.bench.workload import Workload

T = TypeVar("T")

__all__ = ["BenchSettings", "normalize_url", "run_bench"]

#: Connecting should be quick even when replies are slow.
_CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """Everything a run needs besides the workload."""

    url: str
    requests: int
    concurrency: int
    workload: Workload
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 120.0


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

    `stop` set (Ctrl-C): no request is sent after it, those in flight are abandoned, and the
    report covers the requests that finished, marked as interrupted.
    """
    url = normalize_url(settings.url)
    headers = {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    limits = httpx.Limits(
        max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency
    )
    timeout = httpx.Timeout(settings.timeout_s, connect=min(_CONNECT_TIMEOUT_S, settings.timeout_s))
    workload = settings.workload
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, timeout=timeout, transport=transport
    ) as client:
        served = await _unless_stopped(discover_models(client, url), stop)
        models = choose_models(workload.mix, settings.model, served, url)
        planned = iter(workload.plan(settings.requests))
        results: list[RequestResult] = []

        async def worker() -> None:
            for request in planned:  # a shared iterator: each request is taken once
                result = await send_request(
                    client,
                    workload,
                    request,
                    models[request.tier],
                    timeout_s=settings.timeout_s,
                    clock=clock,
                )
                results.append(result)
                if on_result is not None:
                    on_result(result)

        start = clock()
        async with asyncio.TaskGroup() as group:
            workers = [
                group.create_task(worker())
                for _ in range(min(settings.concurrency, settings.requests))
            ]
            if stop is not None:
                group.create_task(_cancel_on(stop, workers))
        wall_s = clock() - start

    run = RunInfo(
        interrupted=stop is not None and stop.is_set(),
        url=url,
        requests=settings.requests,
        concurrency=settings.concurrency,
        mix=workload.mix,
        models=models,
        input_tokens=workload.input_tokens,
        max_tokens=workload.max_tokens,
        tools_fraction=workload.tools_fraction,
        seed=workload.seed,
    )
    results.sort(key=lambda r: r.index)
    return summarize(results, run, wall_s)


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
