"""Fault injection: the x-tiergate-fault header (only where enabled) and the seeded failure
rate."""

from __future__ import annotations

import httpx
import pytest
from sim_server_helpers import ClientFactory, chat, sse

from tiergate.sim_nodes.server import FAULT_HEADER


@pytest.fixture
async def client(make_client: ClientFactory) -> httpx.AsyncClient:
    """A node that honours the fault header (`--enable-fault-injection`)."""
    return await make_client(fault_header_enabled=True)


async def test_the_fault_header_is_ignored_unless_enabled(make_client: ClientFactory) -> None:
    """Anyone who reaches a node must not be able to make it fail (or, through the router's
    outlier ejection, take it out of service for every tenant)."""
    node = await make_client()
    for value in ("503", "midstream", "teapot"):
        r = await node.post("/v1/chat/completions", json=chat(max_tokens=1),
                            headers={FAULT_HEADER: value})  # fmt: skip
        assert r.status_code == 200, r.text
    _, events = await sse(
        node, "/v1/chat/completions", chat(max_tokens=5, stream=True), {FAULT_HEADER: "midstream"}
    )
    assert events[-1] == "[DONE]"


@pytest.mark.parametrize("status", [500, 503, 429, 400])
async def test_fault_header_forces_status(client: httpx.AsyncClient, status: int) -> None:
    r = await client.post("/v1/chat/completions", json=chat(), headers={FAULT_HEADER: str(status)})
    assert r.status_code == status
    error = r.json()["error"]
    assert error["code"] == "injected_fault"
    assert set(error) == {"message", "type", "code", "param"}
    if status == 429:
        assert r.headers["retry-after"] == "1"
        assert error["type"] == "rate_limit_error"
    assert (await client.post("/v1/chat/completions", json=chat(max_tokens=1))).status_code == 200


async def test_bad_fault_header(client: httpx.AsyncClient) -> None:
    for value in ("teapot", "200", "700"):
        r = await client.post(
            "/v1/completions",
            json={"model": "llama-3.1-8b", "prompt": "x"},
            headers={FAULT_HEADER: value},
        )
        assert r.status_code == 400
        assert r.json()["error"]["param"] == FAULT_HEADER


async def test_midstream_fault_aborts_the_stream(client: httpx.AsyncClient) -> None:
    status, events = await sse(
        client,
        "/v1/chat/completions",
        chat(max_tokens=50, stream=True),
        {FAULT_HEADER: "midstream"},
    )
    assert status == 200
    assert "[DONE]" not in events
    *chunks, last = events
    assert 1 <= len(chunks) <= 3
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert last["error"]["code"] == "injected_fault"
    node = client.app.state.node  # type: ignore[attr-defined]
    assert node.engine.num_running == 0 and node.engine.kv_usage == 0


async def test_midstream_fault_without_streaming_is_an_error(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat(), headers={FAULT_HEADER: "midstream"})
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"


async def _statuses(client: httpx.AsyncClient, n: int) -> list[int]:
    return [
        (await client.post("/v1/chat/completions", json=chat(max_tokens=1))).status_code
        for _ in range(n)
    ]


async def test_failure_rate_is_seeded(make_client: ClientFactory) -> None:
    first = await _statuses(await make_client(failure_rate=0.3, seed=4), 200)
    again = await _statuses(await make_client(failure_rate=0.3, seed=4), 200)
    assert first == again
    failed = [s for s in first if s != 200]
    assert set(failed) == {500, 503}
    assert 0.2 <= len(failed) / len(first) <= 0.4
    assert set(await _statuses(await make_client(), 20)) == {200}
