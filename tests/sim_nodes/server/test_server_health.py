"""Liveness, readiness and the model list."""

from __future__ import annotations

import httpx
import pytest
from sim_server_helpers import ClientFactory, node_config

from tiergate.sim_nodes.engine.clock import VirtualClock
from tiergate.sim_nodes.perf import ServingSpec
from tiergate.sim_nodes.server import create_app, running


async def test_ready_only_while_the_engine_runs() -> None:
    app = create_app(node_config(), clock=VirtualClock())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://node"
    ) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 503
        r = await client.post("/v1/completions", json={"model": "llama-3.1-8b", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        async with running(app):
            assert (await client.get("/ready")).status_code == 200
            assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 503
        assert (await client.get("/health")).status_code == 200


async def test_a_node_whose_engine_failed_reports_unhealthy_and_refuses_with_503(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(node_config(), clock=VirtualClock())

    def broken(start_s: float) -> None:
        raise ZeroDivisionError("float division by zero")

    body = {"model": "llama-3.1-8b", "prompt": "x", "max_tokens": 4}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://node"
    ) as client:
        async with running(app) as node:
            monkeypatch.setattr(node.engine, "step", broken)
            first = await client.post("/v1/completions", json=body)
            assert first.status_code == 503, first.text  # its generation aborted
            again = await client.post("/v1/completions", json=body)
            assert again.status_code == 503, again.text
            error = again.json()["error"]
            assert error["code"] == "engine_failed" and "ZeroDivisionError" in error["message"]
            assert (await client.get("/health")).status_code == 503
            assert (await client.get("/ready")).status_code == 503
    failed = [r for r in caplog.records if "event=engine_failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "ERROR", caplog.text


async def test_models_lists_every_served_name(make_client: ClientFactory) -> None:
    client = await make_client(served_model_names=["fast", "fast-alias"])
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fast", "fast-alias"]
    assert all(m["object"] == "model" and m["root"] == "llama-3.1-8b" for m in body["data"])
    assert body["data"][0]["max_model_len"] == 131072


async def test_a_shorter_context_is_the_one_served(make_client: ClientFactory) -> None:
    """spec.maxContextTokens (vLLM's --max-model-len) below the model's: listed, and a request
    past it refused."""
    serving = ServingSpec(model="llama-3.1-8b", accelerator="h100-sxm", max_context_tokens=1000)
    client = await make_client(serving=serving)
    body = (await client.get("/v1/models")).json()
    assert body["data"][0]["max_model_len"] == 1000
    fits = {"model": "llama-3.1-8b", "prompt": [1] * 900, "max_tokens": 100}
    assert (await client.post("/v1/completions", json=fits)).status_code == 200
    longer = await client.post("/v1/completions", json={**fits, "max_tokens": 101})
    assert longer.status_code == 400, longer.text
    error = longer.json()["error"]
    assert error["code"] == "context_length_exceeded" and "1000" in error["message"], error


async def test_models_defaults_to_the_catalog_name(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert [m["id"] for m in body["data"]] == ["llama-3.1-8b"]
