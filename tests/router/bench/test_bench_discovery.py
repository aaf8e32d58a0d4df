"""Choosing each tier's model from GET /v1/models, and refusing to start when that fails."""

from __future__ import annotations

import httpx
import pytest
from bench_helpers import models_response

from tiergate.bench.discovery import (
    ServedModel,
    choose_models,
    discover_models,
    parse_model_list,
)
from tiergate.bench.errors import BenchError

URL = "http://router"
TIERED = [
    ServedModel("frontier", ("batched", "premium")),
    ServedModel("frontier-spark", ("wafer-scale",)),
]


def test_each_tier_gets_a_model_the_router_serves_in_it() -> None:
    chosen = choose_models(["batched", "premium", "wafer-scale"], None, TIERED, URL)
    assert chosen == {"batched": "frontier", "premium": "frontier", "wafer-scale": "frontier-spark"}


def test_a_plain_server_s_first_model_serves_every_tier() -> None:
    plain = [ServedModel("llama", None), ServedModel("other", None)]
    assert choose_models(["batched", "premium"], None, plain, URL) == {
        "batched": "llama",
        "premium": "llama",
    }


def test_an_explicit_model_wins_even_without_a_model_list() -> None:
    assert choose_models(["premium"], "x", None, URL) == {"premium": "x"}


def test_a_tier_no_model_serves_is_an_error() -> None:
    with pytest.raises(BenchError, match="no model of http://router is served in tier premium"):
        choose_models(["premium"], None, [ServedModel("spark", ("wafer-scale",))], URL)


def test_no_model_list_without_model_is_an_error() -> None:
    with pytest.raises(BenchError, match="pass --model"):
        choose_models(["batched"], None, None, URL)
    with pytest.raises(BenchError, match="lists no models"):
        choose_models(["batched"], None, [], URL)


def test_model_list_parsing_tolerates_odd_entries() -> None:
    data = {
        "data": [
            {"id": "a", "tiers": ["batched", 3]},
            {"id": 5},
            "junk",
            {"id": "b", "tiers": "premium"},
        ]
    }
    assert parse_model_list(data) == [ServedModel("a", ("batched",)), ServedModel("b", None)]
    with pytest.raises(ValueError):
        parse_model_list({"models": []})


async def discover(handler: httpx.MockTransport) -> list[ServedModel] | None:
    async with httpx.AsyncClient(transport=handler, base_url=URL) as client:
        return await discover_models(client, URL)


async def test_discovery_reads_the_tiers_field() -> None:
    transport = httpx.MockTransport(
        lambda r: models_response([{"id": "frontier", "tiers": ["premium"]}])
    )
    assert await discover(transport) == [ServedModel("frontier", ("premium",))]


async def test_a_server_without_a_model_list_is_not_an_error_yet() -> None:
    assert await discover(httpx.MockTransport(lambda r: httpx.Response(404))) is None
    assert await discover(httpx.MockTransport(lambda r: httpx.Response(200, text="hi"))) is None


async def test_a_refused_key_stops_the_bench() -> None:
    body = {"error": {"message": "bad key", "type": "auth", "code": None}}
    transport = httpx.MockTransport(lambda r: httpx.Response(401, json=body))
    with pytest.raises(BenchError, match=r"refused the API key \(401\): bad key"):
        await discover(transport)


async def test_an_unreachable_server_stops_the_bench() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(BenchError, match="cannot connect to http://router"):
        await discover(httpx.MockTransport(refuse))
