"""Metrics parsing; the Scraper with a scripted fetch; its fetcher and a sim node on sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from loopback_ports import refused_url
from policy_helpers import endpoint

from tiergate.router.admission import saturated
from tiergate.router.discovery.scraper import (
    FORGET_AFTER_FAILURES,
    EndpointMetrics,
    Fetch,
    MetricsFetcher,
    MetricsParseError,
    ScrapeError,
    Scraper,
    ScrapeRound,
    parse_vllm_metrics,
)
from tiergate.router.endpoints.state import EndpointState
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

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


SGLANG_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified"} 6.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",engine_type="unified"} 0.3
"""
LLAMACPP_TEXT = """\
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SGLANG_TEXT, EndpointMetrics(running=6.0, waiting=2.0, kv_usage=0.3)),
        (LLAMACPP_TEXT, EndpointMetrics(running=1.0, waiting=3.0, kv_usage=0.125)),
        # A llama.cpp release that no longer exports its KV usage: that figure is unknown.
        (LLAMACPP_TEXT.split("# TYPE llamacpp:kv")[0], EndpointMetrics(running=1.0, waiting=3.0)),
        # An exposition with several engines' names: vLLM's win.
        (VLLM_TEXT + SGLANG_TEXT, EndpointMetrics(running=5.0, waiting=4.0, kv_usage=0.5)),
    ],
)
def test_parse_reads_sglang_and_llama_cpp_names_too(text: str, expected: EndpointMetrics) -> None:
    assert parse_vllm_metrics(text) == expected


def test_parse_clamps_and_ignores_nan() -> None:
    text = (
        "vllm:kv_cache_usage_perc 1.7\n"
        "vllm:num_requests_running NaN\n"
        "vllm:num_requests_waiting -1\n"
        "vllm:num_requests_waiting_other 5 1700000000000\n"
    )
    assert parse_vllm_metrics(text) == EndpointMetrics(running=None, waiting=0.0, kv_usage=1.0)


def test_parse_ignores_infinities() -> None:
    """An engine that reports +Inf waiting, or caches at +Inf and -Inf, says nothing usable:
    taken in, an infinite load makes every load-aware score NaN, and the endpoints are picked
    by their place in the list, the overloaded one first."""
    text = (
        'vllm:kv_cache_usage_perc{engine="0"} +Inf\n'
        'vllm:kv_cache_usage_perc{engine="1"} -Inf\n'
        'vllm:kv_cache_usage_perc{engine="2"} 0.5\n'
        "vllm:num_requests_running 3\n"
        "vllm:num_requests_waiting +Inf\n"
    )
    assert parse_vllm_metrics(text) == EndpointMetrics(running=3.0, waiting=None, kv_usage=0.5)


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


# -- Scraper with a scripted fetch -------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def answering(text: str = VLLM_TEXT) -> Fetch:
    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        return text

    return fetch


def silent_until_timeout(clock: FakeClock) -> Callable[[float], Awaitable[str]]:
    """A black-holed endpoint: nothing comes back, and the fetch gives up after `timeout_s`
    of the fake clock, as aiohttp's would."""

    async def wait(timeout_s: float) -> str:
        deadline_s = clock.now_s + timeout_s
        while clock.now_s < deadline_s - 1e-9:
            await asyncio.sleep(0)
        raise ScrapeError("TimeoutError")

    return wait


def fake_sleep(clock: FakeClock) -> Callable[[float], Awaitable[None]]:
    async def sleep(wait_s: float) -> None:
        for _ in range(20):  # let the scrapes this tick started run as far as they can first
            await asyncio.sleep(0)
        clock.now_s += wait_s

    return sleep


async def test_scrape_once_updates_states_in_place() -> None:
    seen: list[tuple[str, float]] = []

    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        seen.append((url, timeout_s))
        return VLLM_TEXT

    eps = [endpoint("http://a:9000/"), endpoint("http://b:9000")]
    clock = FakeClock()
    scraper = Scraper(lambda: eps, fetch, clock=clock, interval_s=2.0)
    result = await scraper.scrape_once()
    assert (result.scraped, result.failed) == (2, 0)
    # The per-request timeout is shorter than the interval.
    assert sorted(seen) == [("http://a:9000/metrics", 1.6), ("http://b:9000/metrics", 1.6)]
    for ep in eps:
        assert (ep.running, ep.waiting, ep.kv_usage, ep.scraped_at_s) == (5.0, 4.0, 0.5, 100.0)
        assert ep.scrape_failures == 0


async def test_each_round_reports_its_outcome_after_the_states_are_written() -> None:
    eps = [endpoint("http://a:9000"), endpoint("http://b:9000")]
    rounds: list[tuple[int, int, list[float | None]]] = []
    scraper = Scraper(
        lambda: eps,
        answering(),
        clock=FakeClock(),
        on_round=lambda r: rounds.append((r.scraped, r.failed, [ep.waiting for ep in eps])),
    )
    await scraper.scrape_once()
    assert rounds == [(2, 0, [4.0, 4.0])]


@pytest.mark.parametrize("failure", ["refused", "garbage"])
async def test_failed_scrapes_keep_old_values_for_a_while_then_drop_them(failure: str) -> None:
    ep = endpoint("http://a")
    clock = FakeClock()
    healthy = True

    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        if healthy:
            return VLLM_TEXT
        if failure == "refused":
            raise ScrapeError("ClientConnectorError: refused")
        return "<html>not metrics</html>"

    scraper = Scraper(lambda: [ep], fetch, clock=clock)
    await scraper.scrape_once()
    assert saturated([ep], threshold=4.0)
    healthy, clock.now_s = False, 105.0
    for _ in range(FORGET_AFTER_FAILURES - 1):
        result = await scraper.scrape_once()
        assert result.failed == 1
    assert (ep.running, ep.waiting, ep.kv_usage) == (5.0, 4.0, 0.5)  # a blip: kept
    assert ep.scraped_at_s == 100.0  # stale by 5 s, and it shows
    await scraper.scrape_once()
    assert ep.scrape_failures == FORGET_AFTER_FAILURES
    assert (ep.running, ep.waiting, ep.kv_usage) == (None, None, None)
    # Unknown is not saturated: a node whose metrics stay unreadable cannot pin its tier.
    assert not saturated([ep], threshold=4.0)
    healthy, clock.now_s = True, 110.0
    await scraper.scrape_once()
    assert (ep.scrape_failures, ep.scraped_at_s) == (0, 110.0)
    assert (ep.running, ep.waiting, ep.kv_usage) == (5.0, 4.0, 0.5)


async def test_endpoints_are_scraped_concurrently() -> None:
    # Each reply waits until every request has arrived: a sequential scraper would hang.
    arrived = 0
    all_arrived = asyncio.Event()

    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_arrived.set()
        await all_arrived.wait()
        return VLLM_TEXT

    eps = [endpoint(f"http://e{i}") for i in range(3)]
    scraper = Scraper(lambda: eps, fetch, clock=FakeClock())
    async with asyncio.timeout(5):
        result = await scraper.scrape_once()
    assert result.scraped == 3


async def test_start_scrapes_every_interval_and_stop_cancels() -> None:
    current: list[EndpointState] = [endpoint("http://a")]
    scraper = Scraper(
        lambda: current,
        answering(),
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


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Scraper(list, answering(), clock=FakeClock(), interval_s=0)


# -- MetricsFetcher against real sockets -------------------------------------------------------


async def replying(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """/metrics, or the ways a page fails: /500/metrics, /404/..., /big/..., /slow/..., /html/..."""
    if scope["type"] != "http":
        return
    fault = scope["path"].split("/")[1]
    status, body = 200, VLLM_TEXT.encode()
    if fault == "500":
        status, body = 500, b"boom"
    elif fault == "404":
        status, body = 404, b""
    elif fault == "big":
        body = b"vllm:num_requests_running 1\n" * 100_000
    elif fault == "slow":  # never answers: waits for the client to give up and leave
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    elif fault == "html":
        body = b"<html>not metrics</html>"
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def metrics_server(served: Callable[[Any], AbstractContextManager[str]]) -> Iterator[str]:
    with served(replying) as url:
        yield url


async def test_fetcher_reads_a_page_and_refuses_bad_replies(metrics_server: str) -> None:
    fetch = MetricsFetcher()
    try:
        assert await fetch(metrics_server + "/metrics", 2.0, 1 << 20) == VLLM_TEXT
        for path, error in [
            ("/500/metrics", "HTTP 500"),
            ("/404/metrics", "HTTP 404"),
            ("/big/metrics", "reply larger than 1048576 bytes"),
            ("/slow/metrics", "TimeoutError"),
        ]:
            with pytest.raises(ScrapeError, match=error):
                await fetch(metrics_server + path, 0.3, 1 << 20)
        refused = refused_url() + "/metrics"
        with pytest.raises(ScrapeError, match="ClientConnectorError"):
            await fetch(refused, 1.0, 1 << 20)
        # and after all that, the same session still scrapes
        assert await fetch(metrics_server + "/metrics", 2.0, 1 << 20) == VLLM_TEXT
    finally:
        await fetch.aclose()


async def test_a_scraper_over_real_sockets_counts_each_failure(metrics_server: str) -> None:
    fetch = MetricsFetcher()
    good, html, big = (endpoint(metrics_server + p) for p in ("", "/html", "/big"))
    try:
        scraper = Scraper(lambda: [good, html, big], fetch, clock=FakeClock())
        result = await scraper.scrape_once()
    finally:
        await fetch.aclose()
    assert (result.scraped, result.failed) == (1, 2)
    assert good.running == 5.0 and html.scrape_failures == big.scrape_failures == 1


# -- a real sim node -----------------------------------------------------------------------------


async def test_scrapes_a_real_sim_node(
    served: Callable[[Any], AbstractContextManager[str]],
) -> None:
    config = NodeConfig(
        serving=ServingSpec(
            model="llama-3.1-8b", accelerator="h100-sxm", batching=BatchingSpec(max_num_seqs=8)
        ),
        background_sequences=3,
        background_context_tokens=2000,
    )
    fetch = MetricsFetcher()
    try:
        with served(create_app(config)) as url:
            ep = endpoint(url)
            result = await Scraper(lambda: [ep], fetch, clock=FakeClock()).scrape_once()
            text = await fetch(url + "/metrics", 2.0, 1 << 20)
    finally:
        await fetch.aclose()
    assert result.scraped == 1
    assert ep.running == 3.0 and ep.waiting == 0.0
    assert ep.kv_usage is not None and 0.0 < ep.kv_usage < 1.0
    # The full exposition (histograms and all) parses to the same numbers.
    assert parse_vllm_metrics(text) == EndpointMetrics(ep.running, ep.waiting, ep.kv_usage)


def test_rounds_stretch_with_the_fleet_to_bound_the_scrape_rate() -> None:
    fleet: list[EndpointState] = []
    scraper = Scraper(
        lambda: fleet,
        answering(),
        clock=lambda: 0.0,
        interval_s=0.5,
        max_scrapes_per_s=50,
    )
    assert scraper.round_interval_s() == 0.5
    fleet.extend(
        EndpointState(f"http://127.0.0.{i}:9000", "p", "batched", "m", ("m",)) for i in range(300)
    )
    assert scraper.round_interval_s() == 6.0  # 300 endpoints at 50 scrapes/s


async def test_background_scrapes_of_300_endpoints_trickle_and_rounds_end_each_period() -> None:
    clock = FakeClock()
    requests_at: dict[float, int] = {}

    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        requests_at[clock.now_s] = requests_at.get(clock.now_s, 0) + 1
        return VLLM_TEXT

    eps = [endpoint(f"http://e{i}:9000") for i in range(300)]
    rounds: list[tuple[float, int, int, bool]] = []
    scraper = Scraper(
        lambda: eps,
        fetch,
        clock=clock,
        interval_s=0.5,
        max_scrapes_per_s=50,
        sleep=fake_sleep(clock),
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


async def test_a_silent_endpoint_holds_up_only_itself() -> None:
    # The last endpoint of the ring never answers: its scrape waits out the timeout (0.4 s)
    # right at the end of each pass. The others' trickle must not pause behind it and then
    # burst to catch up.
    clock = FakeClock()
    silent = silent_until_timeout(clock)
    requests_at: dict[float, int] = {}
    eps = [endpoint(f"http://e{i}:9000") for i in range(300)]

    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        requests_at[clock.now_s] = requests_at.get(clock.now_s, 0) + 1
        if url == "http://e299:9000/metrics":
            return await silent(timeout_s)
        return VLLM_TEXT

    rounds: list[tuple[float, int, int]] = []
    scraper = Scraper(
        lambda: eps,
        fetch,
        clock=clock,
        interval_s=0.5,
        max_scrapes_per_s=50,
        sleep=fake_sleep(clock),
        on_round=lambda r: rounds.append((clock.now_s, r.scraped, r.failed)),
    )
    scraper.start()
    async with asyncio.timeout(10):
        while len(rounds) < 3:
            await asyncio.sleep(0)
    await scraper.stop()
    assert max(requests_at.values()) == 1
    # 50 scrapes a second throughout: the trickle went on while the silent one waited.
    starts = sorted(requests_at)
    assert max(b - a for a, b in zip(starts, starts[1:], strict=False)) == pytest.approx(0.02)
    # Each round ends when its last scrape does: the silent endpoint's, 0.4 s after it began.
    assert [(scraped, failed) for _, scraped, failed in rounds] == [(299, 1)] * 3
    ends = [at_s - 100.0 for at_s, *_ in rounds]
    assert ends == pytest.approx([5.98 + 0.4, 11.98 + 0.4, 17.98 + 0.4], abs=0.021)
    assert eps[299].scrape_failures == 3 and eps[0].scrape_failures == 0


async def test_an_endpoint_slower_than_its_period_is_scraped_once_at_a_time() -> None:
    clock = FakeClock()
    silent = silent_until_timeout(clock)
    calls = {"http://a:9000/metrics": 0, "http://b:9000/metrics": 0}
    waiting = 0
    most_waiting = 0

    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        nonlocal waiting, most_waiting
        calls[url] += 1
        if url == "http://b:9000/metrics":
            waiting += 1
            most_waiting = max(most_waiting, waiting)
            try:
                return await silent(timeout_s)
            finally:
                waiting -= 1
        return VLLM_TEXT

    eps = [endpoint("http://a:9000"), endpoint("http://b:9000")]
    rounds: list[ScrapeRound] = []
    scraper = Scraper(
        lambda: eps,
        fetch,
        clock=clock,
        interval_s=0.1,
        timeout_s=1.0,  # longer than the period: b's scrape spans ten passes
        sleep=fake_sleep(clock),
        on_round=rounds.append,
    )
    scraper.start()
    async with asyncio.timeout(10):
        while calls["http://b:9000/metrics"] < 4:
            await asyncio.sleep(0)
    await scraper.stop()
    assert most_waiting == 1
    # b at 0.05 s, then at its first slot after each scrape timed out: 1.15, 2.25, 3.35 s.
    assert clock.now_s - 100.0 == pytest.approx(3.35)
    assert calls["http://a:9000/metrics"] == 34  # every 0.1 s, held up by nothing
    # Passes in which b was skipped end at once, those with b when its scrape times out. All
    # are reported but the last, which b's scrape in flight at stop() belonged to.
    assert sum(r.failed for r in rounds) == 3
    assert sum(r.scraped for r in rounds) == 34 - 1
    ended = len(rounds)
    await asyncio.sleep(0)
    assert len(rounds) == ended  # nothing reported after stop()
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def test_a_scrape_that_breaks_unexpectedly_is_logged_and_counted_as_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fetch(url: str, timeout_s: float, max_bytes: int) -> str:
        if "b" in url:
            raise RuntimeError("a bug, not a refused connection")
        return VLLM_TEXT

    clock = FakeClock()
    rounds: list[ScrapeRound] = []
    eps = [endpoint("http://a:9000"), endpoint("http://b:9000")]
    scraper = Scraper(
        lambda: eps, fetch, clock=clock, sleep=fake_sleep(clock), on_round=rounds.append
    )
    scraper.start()
    async with asyncio.timeout(5):
        while len(rounds) < 2:
            await asyncio.sleep(0)
    await scraper.stop()
    assert rounds[:2] == [ScrapeRound(scraped=1, failed=1)] * 2  # and scraping went on
    assert "event=scrape_bug" in caplog.text
