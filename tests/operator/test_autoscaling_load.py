"""Reading a pool's load from its pods' metrics: the text of a real sim node (run in-process
on a virtual clock, through httpx.ASGITransport), background sequences subtracted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
from gate_clock import GateClock

from tiergate.operator.autoscaling.load import (
    MetricsError,
    PodMetrics,
    observed_load,
    observed_shape,
    parse_pod_metrics,
)
from tiergate.sim_nodes.engine.clock import VirtualClock
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app, running

MODEL = "llama-3.1-8b"
Node = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    """`await node(clock=..., **NodeConfig fields)` -> a client of a running sim node."""
    async with AsyncExitStack() as stack:

        async def make(clock: Any = None, **overrides: Any) -> httpx.AsyncClient:
            serving = ServingSpec(
                model=MODEL, accelerator="h100-sxm", batching=BatchingSpec(max_num_seqs=8)
            )
            app = create_app(
                NodeConfig(serving=serving, **overrides), clock=clock or VirtualClock()
            )
            await stack.enter_async_context(running(app))
            transport = httpx.ASGITransport(app=app)
            client = httpx.AsyncClient(transport=transport, base_url="http://node")
            return await stack.enter_async_context(client)

        yield make


def chat(max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": max_tokens,
    }


async def scrape(client: httpx.AsyncClient) -> PodMetrics:
    reply = await client.get("/metrics")
    assert reply.status_code == 200
    return parse_pod_metrics(reply.text)


async def test_an_idle_node_reports_no_load(node: Node) -> None:
    assert await scrape(await node()) == PodMetrics(running=0, waiting=0)


async def test_background_sequences_are_not_demand(node: Node) -> None:
    # The engine counts its background sequences as running: 4 of them, no request.
    client = await node(background_sequences=4, background_context_tokens=2000)
    raw = (await client.get("/metrics")).text
    assert 'vllm:num_requests_running{model_name="llama-3.1-8b"} 4.0' in raw
    assert (await scrape(client)).running == 0


async def test_a_running_request_beside_the_background(node: Node) -> None:
    clock = GateClock()
    client = await node(clock=clock, background_sequences=4, background_context_tokens=2000)
    pending = asyncio.create_task(client.post("/v1/chat/completions", json=chat(4)))
    async with asyncio.timeout(5):
        while (metrics := await scrape(client)).running == 0:
            await asyncio.sleep(0.001)
    assert (metrics.running, metrics.waiting) == (1, 0)
    clock.gate.set()
    assert (await pending).status_code == 200
    assert (await scrape(client)).running == 0


async def test_the_shape_is_the_mean_of_finished_requests(node: Node) -> None:
    client = await node()
    prompt = output = 0
    for i in range(20):
        usage = (await client.post("/v1/chat/completions", json=chat(3 + i % 2))).json()["usage"]
        prompt += usage["prompt_tokens"]
        output += usage["completion_tokens"]
    metrics = await scrape(client)
    assert metrics.finished == 20
    shape = observed_shape([metrics])
    assert shape is not None
    assert (shape.input_tokens, shape.output_tokens, shape.source) == (
        round(prompt / 20),
        round(output / 20),
        "observed",
    )


def test_too_few_finished_requests_give_no_shape() -> None:
    pods = [PodMetrics(0, 0, 1000.0, 100.0, 10.0), PodMetrics(0, 0, 900.0, 90.0, 9.0)]
    assert observed_shape(pods) is None
    assert observed_shape([*pods, PodMetrics(0, 0, 100.0, 10.0, 1.0)]) is not None
    assert observed_shape([]) is None
    assert observed_shape([PodMetrics(0, 0)], minimum_finished=0) is None  # never divides by 0


def test_the_load_sums_the_pods() -> None:
    load = observed_load([PodMetrics(3, 1), PodMetrics(5, 0), PodMetrics(0, 2)])
    assert (load.pods, load.running, load.waiting, load.demand) == (3, 8, 3, 11)
    assert observed_load([]).pods == 0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<html>502 Bad Gateway</html>\n", "unreadable"),
        ("# TYPE up gauge\nup 1\n", "no vllm:num_requests_running, vllm:num_requests_waiting"),
        ("vllm:num_requests_running 2\n", "no vllm:num_requests_waiting"),
    ],
)
def test_text_that_is_not_a_sim_nodes_is_refused(text: str, says: str) -> None:
    with pytest.raises(MetricsError, match=says):
        parse_pod_metrics(text)


def test_samples_of_several_models_are_summed() -> None:
    text = (
        'vllm:num_requests_running{model_name="a"} 2\n'
        'vllm:num_requests_running{model_name="b"} 3\n'
        'vllm:num_requests_waiting{model_name="a"} 1\n'
        'vllm:request_success_total{model_name="a",finished_reason="length"} 4\n'
        'vllm:request_success_total{model_name="a",finished_reason="stop"} 6\n'
    )
    assert parse_pod_metrics(text) == PodMetrics(5, 1, finished=10.0)


GOOD = (
    "vllm:num_requests_running 6\n"
    "vllm:num_requests_waiting 2\n"
    "tiergate_background_sequences 2\n"
    "vllm:request_success_total 10\n"
)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (GOOD.replace("running 6", "running NaN"), "vllm:num_requests_running is nan"),
        (GOOD.replace("waiting 2", "waiting +Inf"), "vllm:num_requests_waiting is inf"),
        (GOOD.replace("sequences 2", "sequences -Inf"), "tiergate_background_sequences is -inf"),
        (GOOD.replace("success_total 10", "success_total NaN"), "request_success_total is nan"),
        # each sample finite, their sum not
        (GOOD + 'vllm:num_requests_running{model_name="b"} 1.7e308\n' * 2, "running is inf"),
    ],
)
def test_a_value_that_is_not_finite_refuses_the_pods_reading(text: str, says: str) -> None:
    with pytest.raises(MetricsError, match=says):
        parse_pod_metrics(text)


def test_a_value_not_read_may_be_anything() -> None:
    assert parse_pod_metrics(GOOD + "some_quantile NaN\n") == PodMetrics(4, 2, finished=10.0)


#: An SGLang server's page (`--enable-metrics`) as it reads: its scheduler's gauges, its
#: tokenizer's counters (families without `_total`, samples with), and figures not read.
SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",engine_type="unified"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",engine_type="unified"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",engine_type="unified"} 0.41
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="qwen"} 51200.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{model_name="qwen"} 6400.0
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests counter
sglang:num_requests_total{model_name="qwen"} 32.0
# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="qwen"} 20.0
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="qwen"} 32.0
sglang:e2e_request_latency_seconds_count{model_name="qwen"} 32.0
sglang:e2e_request_latency_seconds_sum{model_name="qwen"} 24.5
"""


def test_an_sglang_pods_load_and_shape_are_read_from_its_own_names() -> None:
    metrics = parse_pod_metrics(SGLANG_PAGE)
    assert metrics == PodMetrics(7, 3, prompt_tokens=51200.0, generation_tokens=6400.0,
                                 finished=32.0)  # fmt: skip
    shape = observed_shape([metrics])
    assert shape is not None and (shape.input_tokens, shape.output_tokens) == (1600, 200)


def test_an_sglang_value_that_is_not_finite_refuses_the_pods_reading() -> None:
    text = SGLANG_PAGE.replace('"unified"} 3.0', '"unified"} NaN')
    with pytest.raises(MetricsError, match="sglang:num_queue_reqs is nan"):
        parse_pod_metrics(text)


def test_a_page_without_either_engines_gauges_names_both() -> None:
    text = "sglang:num_running_reqs 1\nsglang:token_usage 0.5\n"
    with pytest.raises(MetricsError) as refused:
        parse_pod_metrics(text)
    assert "no vllm:num_requests_running, vllm:num_requests_waiting" in str(refused.value)
    assert "nor SGLang's sglang:num_running_reqs and sglang:num_queue_reqs;" in str(refused.value)
