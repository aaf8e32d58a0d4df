"""Benchmark: parts of the router's request path one at a time, as CPU time in this process.

1. `Pipeline.pick` (the default policy) on a pool's candidate set of 3, 8 and 300 endpoints:
   what scoring a sample of 8 costs next to a pool of 3, and that 300 costs no more than 8.
2. A metrics scrape (GET of the fixed upstream's small vLLM page over loopback): httpx's
   AsyncClient with kept-alive connections, the scraper's `MetricsFetcher` (aiohttp) with
   kept-alive connections, and aiohttp opening a new connection per scrape.
3. A proxied chat completion (POST, whole reply) through httpx's AsyncClient and through the
   router's `Upstream` (aiohttp's ClientSession).
4. A request's `DisconnectGuard` when the request ends before the guard starts watching (its
   timer set and cancelled: what every quick request pays), and when it ends after (a watcher
   task started and cancelled).

The upstream is `benchmarks/router_overhead/fixed_upstream.py` in its own process, so its CPU
is not counted. Each figure is the median of `--rounds` rounds. Not a test: the figures back
the explanations in benchmarks/README.md, router/upstream/proxy.py and
router/discovery/scraper.py.

    .venv/bin/python -P benchmarks/router_parts.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import uvloop

from tiergate.router.config import parse_config
from tiergate.router.discovery.scraper import MetricsFetcher
from tiergate.router.discovery.view import build_view
from tiergate.router.endpoints.state import CandidateSet, EndpointState, RequestContext
from tiergate.router.policy import default_policy
from tiergate.router.policy.pipeline import Pipeline
from tiergate.router.upstream.disconnect import DisconnectGuard
from tiergate.router.upstream.proxy import Upstream
from tiergate.sim_nodes.catalogs import default_catalog

FIXED_UPSTREAM = Path(__file__).resolve().parent / "router_overhead" / "fixed_upstream.py"
MODEL = "llama-3.1-8b"
BODY = (
    b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}'
)


def median_us(rounds: int, per_round: Callable[[], float]) -> float:
    return statistics.median(per_round() for _ in range(rounds))


def pick_us(candidates: int, rounds: int, picks: int = 20_000) -> float:
    """CPU microseconds per `Pipeline.pick` over `candidates` idle endpoints of one pool."""
    config = parse_config(
        "pools:\n  - {name: p0, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
        "batching: {maxNumSeqs: 256}, endpoints: [http://e0]}\n"
    )
    view = build_view(config.pools, default_catalog())
    pipeline = Pipeline.from_config(default_policy(), pools=lambda: view, rng=random.Random(0))
    members = CandidateSet(
        (
            EndpointState(f"http://e{i}", "p0", "batched", MODEL, (MODEL,))
            for i in range(candidates)
        ),
        MODEL,
        "batched",
    )
    ctx = RequestContext(MODEL, "batched", 1000, 200, (1, 2, 3))

    def one_round() -> float:
        started = time.process_time()
        for _ in range(picks):
            pipeline.pick(ctx, members, 100.0)
        return (time.process_time() - started) / picks * 1e6

    return median_us(rounds, one_round)


async def async_us(rounds: int, calls: int, call: Callable[[], Awaitable[object]]) -> float:
    """CPU microseconds per awaited `call()` (after a warm-up)."""
    for _ in range(50):
        await call()
    results = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            await call()
        results.append((time.process_time() - started) / calls * 1e6)
    return statistics.median(results)


async def guard_rows(rounds: int, calls: int) -> list[tuple[str, float]]:
    gone = asyncio.Event()  # never set: the client stays

    async def receive() -> dict[str, object]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def quick() -> None:
        guard = DisconnectGuard(receive)
        with guard.cancellable():
            await asyncio.sleep(0)
        guard.stop()

    async def watched() -> None:
        guard = DisconnectGuard(receive, delay_s=0)
        await asyncio.sleep(0)  # the timer fires: the watcher task starts
        await asyncio.sleep(0)  # and waits on `receive`
        with guard.cancellable():
            await asyncio.sleep(0)
        guard.stop()

    async def bare() -> None:
        await asyncio.sleep(0)

    baseline = await async_us(rounds, calls, bare)
    return [
        ("DisconnectGuard, request ends before watching (minus a bare await)",
         await async_us(rounds, calls, quick) - baseline),
        ("DisconnectGuard, request watched (minus a bare await)",
         await async_us(rounds, calls, watched) - 2 * baseline),
    ]  # fmt: skip


async def clients(url: str, rounds: int, calls: int) -> list[tuple[str, float]]:
    metrics_url = url + "/metrics"
    rows: list[tuple[str, float]] = []
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(limits=limits, timeout=5.0) as client:

        async def httpx_scrape() -> None:
            (await client.get(metrics_url)).raise_for_status()

        async def httpx_proxy() -> None:
            r = await client.post(url + "/v1/chat/completions", content=BODY,
                                  headers={"content-type": "application/json"})  # fmt: skip
            r.raise_for_status()

        rows.append(
            ("scrape: httpx AsyncClient, kept-alive", await async_us(rounds, calls, httpx_scrape))
        )
        rows.append(("proxy: httpx AsyncClient", await async_us(rounds, calls, httpx_proxy)))

    fetcher = MetricsFetcher()
    try:
        kept = await async_us(rounds, calls, lambda: fetcher(metrics_url, 5.0, 1 << 20))
        rows.append(("scrape: MetricsFetcher (aiohttp), kept-alive", kept))
    finally:
        await fetcher.aclose()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:

        async def new_connection_scrape() -> None:
            async with fresh.get(metrics_url) as response:
                await response.read()

        rows.append(("scrape: aiohttp, new connection each",
                     await async_us(rounds, calls, new_connection_scrape)))  # fmt: skip

    upstream = Upstream()
    endpoint = EndpointState(url, "p0", "batched", MODEL, (MODEL,))
    try:

        async def router_proxy() -> None:
            opened = await upstream.open([endpoint], "/v1/chat/completions", BODY,
                                         {"content-type": "application/json"})  # fmt: skip
            await opened.read()
            await opened.close()

        rows.append(("proxy: router Upstream (aiohttp ClientSession)",
                     await async_us(rounds, calls, router_proxy)))  # fmt: skip

        async def router_proxy_whole() -> None:
            opened = await upstream.open([endpoint], "/v1/chat/completions", BODY,
                                         {"content-type": "application/json"},
                                         whole=True)  # fmt: skip
            await opened.read()
            await opened.close()

        # A whole reply's head is awaited beside a watch of its node's scrapes.
        rows.append(("proxy: router Upstream, a whole reply (its wait watched)",
                     await async_us(rounds, calls, router_proxy_whole)))  # fmt: skip
    finally:
        await upstream.aclose()
    return rows


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="HTTP calls per round")
    args = parser.parse_args()
    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-P", str(FIXED_UPSTREAM), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(url + "/health", timeout=1.0)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or upstream.poll() is not None:
                    print("the fixed upstream did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)
        rows = [(f"Pipeline.pick, {n} candidates", pick_us(n, args.rounds)) for n in (3, 8, 300)]
        rows += uvloop.run(clients(url, args.rounds, args.calls))
        rows += uvloop.run(guard_rows(args.rounds, 20 * args.calls))
    finally:
        upstream.terminate()
        upstream.wait()
    command = f"python benchmarks/router_parts.py --rounds {args.rounds} --calls {args.calls}"
    print(f"Command: `{command}` (medians of {args.rounds} rounds; CPU time of this process)\n")
    print("| part | CPU per call (us) |\n|---|---:|")
    for label, us in rows:
        print(f"| {label} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
