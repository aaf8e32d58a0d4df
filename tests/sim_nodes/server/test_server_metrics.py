"""Prometheus metrics under vLLM's names, read from the engine at scrape time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from gate_clock import GateClock
from sim_server_helpers import MODEL, ClientFactory, app_of, chat, eventually, metric

VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "tiergate_background_sequences",
]


async def scrape(client: httpx.AsyncClient) -> str:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


async def test_names_present_with_model_label(client: httpx.AsyncClient) -> None:
    await client.post("/v1/chat/completions", json=chat(max_tokens=3))
    text = await scrape(client)
    for name in VLLM_NAMES:
        assert any(
            line.startswith(name + "{") and f'model_name="{MODEL}"' in line
            for line in text.splitlines()
        ), name


async def test_counters_and_histograms_move(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    assert metric(before, "vllm:generation_tokens_total", model_name=MODEL) == 0
    for _ in range(2):
        await client.post("/v1/chat/completions", json=chat(max_tokens=5))
    after = await scrape(client)
    assert metric(after, "vllm:generation_tokens_total", model_name=MODEL) == 10
    assert metric(after, "vllm:prompt_tokens_total", model_name=MODEL) == 2 * 10
    assert metric(after, "vllm:time_to_first_token_seconds_count", model_name=MODEL) == 2
    assert metric(after, "vllm:time_to_first_token_seconds_sum", model_name=MODEL) > 0
    assert metric(after, "vllm:e2e_request_latency_seconds_count", model_name=MODEL) == 2
    assert metric(after, "vllm:time_per_output_token_seconds_count", model_name=MODEL) == 2
    assert metric(after, "vllm:request_success_total", finished_reason="length") == 2
    assert metric(after, "vllm:num_requests_running", model_name=MODEL) == 0
    assert metric(after, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0


async def test_running_and_kv_gauges_during_a_request(make_client: ClientFactory) -> None:
    clock = GateClock()
    client = await make_client(clock=clock)
    pending = asyncio.create_task(
        client.post("/v1/chat/completions", json=chat("long prompt " * 200, max_tokens=4))
    )

    async def running() -> bool:
        return metric(await scrape(client), "vllm:num_requests_running", model_name=MODEL) == 1

    await eventually(running)
    text = await scrape(client)
    assert 0 < metric(text, "vllm:kv_cache_usage_perc", model_name=MODEL) < 1
    clock.gate.set()
    reply = await pending
    assert reply.json()["usage"]["completion_tokens"] == 4
    text = await scrape(client)
    assert metric(text, "vllm:num_requests_running", model_name=MODEL) == 0
    assert metric(text, "vllm:generation_tokens_total", model_name=MODEL) == 4


async def test_background_sequences_show(make_client: ClientFactory) -> None:
    client = await make_client(background_sequences=4, background_context_tokens=2000)
    text = await scrape(client)
    assert metric(text, "tiergate_background_sequences", model_name=MODEL) == 4
    assert metric(text, "vllm:num_requests_running", model_name=MODEL) == 4
    assert metric(text, "vllm:kv_cache_usage_perc", model_name=MODEL) > 0
    assert (await client.post("/v1/chat/completions", json=chat(max_tokens=2))).status_code == 200


def _scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("t", 1),
        "server": ("node", 80),
    }


async def test_client_disconnect_cancels_engine_request(make_client: ClientFactory) -> None:
    client = await make_client()
    app, node = app_of(client), app_of(client).state.node
    body = json.dumps(chat(max_tokens=5000, stream=True)).encode()
    incoming: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]
    disconnected = asyncio.Event()
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message["body"]:
            chunks.append(message["body"])
            if len(chunks) == 2:
                disconnected.set()  # the client goes away after two chunks

    await app(_scope("/v1/chat/completions"), receive, send)
    assert 2 <= len(chunks) < 5000
    assert node.engine.num_running == 0
    assert node.engine.kv_usage == 0
    text = await scrape(client)
    assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1


async def test_disconnect_cancels_non_streaming_request(make_client: ClientFactory) -> None:
    client = await make_client(clock=GateClock())  # the engine never finishes a step
    app, node = app_of(client), app_of(client).state.node
    body = json.dumps(chat(max_tokens=5000)).encode()
    incoming: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await eventually(_running)  # leave once the request is in the batch
        return {"type": "http.disconnect"}

    async def _running() -> bool:
        return bool(node.engine.num_running == 1)

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(_scope("/v1/chat/completions"), receive, send)
    assert node.engine.num_running == 0 and node.engine.kv_usage == 0
    text = await scrape(client)
    assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1
