"""Metrics parsing and the Scraper: MockTransport for failures, a real sim node in-process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from policy_helpers import endpoint

from tiergate.router.scraper import (
    EndpointMetrics,
    MetricsParseError,
    Scraper,
    parse_vllm_metrics,
)
from tiergate.router.state import EndpointState
from tiergate.sim_nodes.engine.clock import VirtualClock
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app, running

VLLM_TEXT = """\
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 2.0
# HELP vllm:num_requests_waiting Requests waiting to run.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 4.0
# HELP vllm:kv_cache_usage_perc KV cache usage (1 = full).
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:kv_cache_usage_perc{model_name="b"} 0.75
# HELP vllm:time_to_first_token_seconds Time to first token.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="a"} 1.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="a"} 1.0
vllm:time_to_first_token_seconds_count{model_name="a"} 1.0
vllm:time_to_first_token_seconds_sum{model_name="a"} 0.05
"""


# -- parse_vllm_metrics ----------------------------------------------------------------------


def test_parse_sums_counts_and_averages_kv_usage_over_labels() -> None:
    assert parse_vllm_metrics(VLLM_TEXT) == EndpointMetrics(running=5.0, waiting=4.0, kv_usage=0.5)


def test_parse_tolerates_missing_metrics_and_reads_the_legacy_kv_name() -> None:
    assert parse_vllm_metrics("") == EndpointMetrics()
    assert parse_vllm_metrics("other_metric 1\n") == EndpointMetrics()
    text = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.4\n"
    assert parse_vllm_metrics(text) == EndpointMetrics(kv_usage=0.4)


def test_parse_clamps_and_ignores_nan() -> None:
    text = (
        "vllm:kv_cache_usage_perc 1.7\n"
        "vllm:num_requests_running NaN\n"
        "vllm:num_requests_waiting -1\n"
        "vllm:num_requests_waiting_other 5 1700000000000\n"
    )
    assert parse_vllm_metrics(text) == EndpointMetrics(running=None, waiting=0.0, kv_usage=1.0)


@pytest.mark.parametrize(
    "text",
    [
        "<html><body><h1>502 Bad Gateway</h1></body></html>",
        '{"error": "not here"}',
        "hello world how are you",
        "\x00\x01\x02binary",
        'vllm:num_requests_running{model_name="a" 3',
        "vllm:num_requests_running three",
    ],
)
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics(text)


# -- Scraper with a mock transport -----------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
async def mock_client() -> AsyncIterator[Callable[[Handler], httpx.AsyncClient]]:
    clients: list[httpx.AsyncClient] = []

    def make(handler: Handler) -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def test_scrape_once_updates_states_in_place(
    mock_client: Callable[[Handler], httpx.AsyncClient],
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=VLLM_TEXT)

    eps = [endpoint("http://a:9000/"), endpoint("http://b:9000")]
    clock = FakeClock()
    scraper = Scraper(lambda: eps, mock_client(handler), clock=clock, interval_s=2.0)
    result = await scraper.scrape_once()
    assert (result.scraped, result.failed) == (2, 0)
    assert sorted(str(r.url) for r in seen) == ["http://a:9000/metrics", "http://b:9000/metrics"]
    # The per-request timeout is shorter than the interval.
    assert seen[0].extensions["timeout"] == {"connect": 1.6, "read": 1.6, "write": 1.6, "pool": 1.6}
    for ep in eps:
        assert (ep.running, ep.waiting, ep.kv_usage, ep.scraped_at_s) == (5.0, 4.0, 0.5, 100.0)
        assert ep.scrape_failures == 0


async def test_on_round_hears_of_each_round_after_the_states_are_written(
    mock_client: Callable[[Handler], httpx.AsyncClient],
) -> None:
    eps = [endpoint("http://a:9000"), endpoint("http://b:9000")]
    rounds: list[tuple[int, int, list[float | None]]] = []
    scraper = Scraper(
        lambda: eps,
        mock_client(lambda request: httpx.Response(200, text=VLLM_TEXT)),
        clock=FakeClock(),
        on_round=lambda r: rounds.append((r.scraped, r.failed, [ep.waiting for ep in eps])),
    )
    await scraper.scrape_once()
    assert rounds == [(2, 0, [4.0, 4.0])]


@pytest.mark.parametrize(
    "failure",
    [
        lambda request: httpx.Response(500, text="boom"),
        lambda request: httpx.Response(404),
        lambda request: httpx.Response(200, text="<html>not metrics</html>"),
        lambda request: httpx.Response(200, content=b"vllm:num_requests_running 1\n" * 100_000),
    ],
    ids=["500", "404", "garbage", "too-big"],
)
async def test_failed_scrapes_keep_old_values_and_count(
    mock_client: Callable[[Handler], httpx.AsyncClient], failure: Handler
) -> None:
    ep = endpoint("http://a")
    clock = FakeClock()
    healthy = True

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=VLLM_TEXT) if healthy else failure(request)

    scraper = Scraper(lambda: [ep], mock_client(handler), clock=clock, max_body_bytes=1 << 20)
    await scraper.scrape_once()
    healthy, clock.now_s = False, 105.0
    for _ in range(3):
        result = await scraper.scrape_once()
        assert result.failed == 1
    assert (ep.running, ep.waiting, ep.kv_usage) == (5.0, 4.0, 0.5)
    assert ep.scraped_at_s == 100.0  # stale by 5 s, and it shows
    assert ep.scrape_failures == 3
    healthy, clock.now_s = True, 110.0
    await scraper.scrape_once()
    assert (ep.scrape_failures, ep.scraped_at_s) == (0, 110.0)


async def test_timeouts_and_connection_errors_are_failures(
    mock_client: Callable[[Handler], httpx.AsyncClient],
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "slow":
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text=VLLM_TEXT)

    slow, down, fine = endpoint("http://slow"), endpoint("http://down"), endpoint("http://fine")
    scraper = Scraper(lambda: [slow, down, fine], mock_client(handler), clock=FakeClock())
    result = await scraper.scrape_once()
    assert (result.scraped, result.failed) == (1, 2)
    assert slow.scrape_failures == down.scrape_failures == 1 and slow.running is None
    assert fine.running == 5.0


async def test_endpoints_are_scraped_concurrently() -> None:
    # Each reply waits until every request has arrived: a sequential scraper would hang.
    arrived = 0
    all_arrived = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_arrived.set()
        await all_arrived.wait()
        return httpx.Response(200, text=VLLM_TEXT)

    eps = [endpoint(f"http://e{i}") for i in range(3)]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        scraper = Scraper(lambda: eps, client, clock=FakeClock())
        async with asyncio.timeout(5):
            result = await scraper.scrape_once()
    assert result.scraped == 3


async def test_start_scrapes_every_interval_and_stop_cancels(
    mock_client: Callable[[Handler], httpx.AsyncClient],
) -> None:
    current: list[EndpointState] = [endpoint("http://a")]
    scraper = Scraper(
        lambda: current,
        mock_client(lambda request: httpx.Response(200, text=VLLM_TEXT)),
        clock=time.monotonic,  # the clock paces the background scrapes
        interval_s=0.01,
    )
    scraper.start()
    scraper.start()  # idempotent
    async with asyncio.timeout(5):
        while scraper.rounds < 2:
            await asyncio.sleep(0.005)
    current.append(endpoint("http://b"))  # discovery changed the endpoints
    rounds = scraper.rounds
    async with asyncio.timeout(5):
        while scraper.rounds < rounds + 2:
            await asyncio.sleep(0.005)
    await scraper.stop()
    await scraper.stop()  # idempotent
    assert current[1].running == 5.0
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "tiergate-scraper"]


async def test_interval_must_be_positive() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ValueError):
            Scraper(list, client, clock=FakeClock(), interval_s=0)


# -- a real sim node, in-process -------------------------------------------------------------


async def test_scrapes_a_real_sim_node() -> None:
    config = NodeConfig(
        serving=ServingSpec(
            model="llama-3.1-8b", accelerator="h100-sxm", batching=BatchingSpec(max_num_seqs=8)
        ),
        background_sequences=3,
        background_context_tokens=2000,
    )
    app = create_app(config, clock=VirtualClock())
    async with running(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport) as client:
            ep = endpoint("http://node")
            result = await Scraper(lambda: [ep], client, clock=FakeClock()).scrape_once()
            text = (await client.get("http://node/metrics")).text
    assert result.scraped == 1
    assert ep.running == 3.0 and ep.waiting == 0.0
    assert ep.kv_usage is not None and 0.0 < ep.kv_usage < 1.0
    # The full exposition (histograms and all) parses to the same numbers.
    assert parse_vllm_metrics(text) == EndpointMetrics(ep.running, ep.waiting, ep.kv_usage)


def test_rounds_stretch_with_the_fleet_to_bound_the_scrape_rate() -> None:
    fleet: list[EndpointState] = []
    scraper = Scraper(
        lambda: fleet,
        httpx.AsyncClient(),
        clock=lambda: 0.0,
        interval_s=0.5,
        max_scrapes_per_s=50,
    )
    assert scraper.round_interval_s() == 0.5
    fleet.extend(
        EndpointState(f"http://127.0.0.{i}:9000", "p", "batched", "m", ("m",)) for i in range(300)
    )
    assert scraper.round_interval_s() == 6.0  # 300 endpoints at 50 scrapes/s


async def test_background_scrapes_of_300_endpoints_trickle_and_rounds_end_each_period(
    mock_client: Callable[[Handler], httpx.AsyncClient],
) -> None:
    clock = FakeClock()
    requests_at: dict[float, int] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        requests_at[clock.now_s] = requests_at.get(clock.now_s, 0) + 1
        return httpx.Response(200, text=VLLM_TEXT)

    async def sleep(wait_s: float) -> None:
        for _ in range(20):  # let the scrapes this tick started run to their end first
            await asyncio.sleep(0)
        clock.now_s += wait_s

    eps = [endpoint(f"http://e{i}:9000") for i in range(300)]
    rounds: list[tuple[float, int, int, bool]] = []
    scraper = Scraper(
        lambda: eps,
        mock_client(handler),
        clock=clock,
        interval_s=0.5,
        max_scrapes_per_s=50,
        sleep=sleep,
        on_round=lambda r: rounds.append(
            (clock.now_s, r.scraped, r.failed, all(ep.waiting == 4.0 for ep in eps))
        ),
    )
    scraper.start()
    async with asyncio.timeout(10):
        while len(rounds) < 3:
            await asyncio.sleep(0)
    await scraper.stop()
    # Spread: one request per tick (50/s), never the round's 300 at once.
    assert max(requests_at.values()) == 1
    # A round is one pass over every endpoint, ended with all its states written, every 6 s.
    assert [(scraped, failed, written) for _, scraped, failed, written in rounds] == [
        (300, 0, True)
    ] * 3
    ends = [at_s - 100.0 for at_s, *_ in rounds]
    assert ends == pytest.approx([5.98, 11.98, 17.98])
