"""The router app on Kubernetes discovery: readiness, and requests reaching discovered pods."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from kube_helpers import ReplayApi, eventually, kube_source, recorded

from tiergate.router.app import RouterApp
from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.kube_state import ENDPOINT_SLICES, INFERENCE_POOLS
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

CONFIG = "router: {ledgerPath: ':memory:', scrapeIntervalS: 30}\ndiscovery: {kubernetes: {}}"


@asynccontextmanager
async def running(app: RouterApp) -> AsyncIterator[httpx.AsyncClient]:
    await app.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            yield client
    finally:
        await app.stop()


async def test_readyz_waits_for_the_first_list_of_both_kinds() -> None:
    api = ReplayApi()
    app = build_app(parse_config(CONFIG), kube_source(api))
    async with running(app) as client:
        r = await client.get("/readyz")
        assert r.status_code == 503 and r.json()["reason"] == "discovery not synced"

        api.give_list(INFERENCE_POOLS, recorded("inferencepools_list"))
        await eventually(lambda: api.calls_of("watch", INFERENCE_POOLS) != [])
        r = await client.get("/readyz")
        assert r.status_code == 503 and r.json()["reason"] == "discovery not synced"

        api.give_list(ENDPOINT_SLICES, recorded("endpointslices_list"))
        await eventually(lambda: app.synced())
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["endpoints"] == 3
        models = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m["tiers"]) for m in models] == [("coder", ["batched", "premium"])]


@pytest.fixture
def node_url(served: Callable[[Any], AbstractContextManager[str]]) -> Any:
    serving = ServingSpec(
        model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec(max_num_seqs=16)
    )
    with served(create_app(NodeConfig(serving=serving, served_model_names=["coder"]))) as url:
        yield url


def pool_on(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An InferencePools list and an EndpointSlices list for one pool whose pod is `url`."""
    pools = recorded("inferencepools_list")
    pools["items"] = pools["items"][:1]
    pools["items"][0]["spec"].update(accelerator="wse-3", chips="auto")
    slices = recorded("endpointslices_list")
    slices["items"] = slices["items"][:1]
    pod = slices["items"][0]
    host, port = url.removeprefix("http://").split(":")
    pod["ports"] = [{"name": "http", "protocol": "TCP", "port": int(port)}]
    pod["endpoints"] = [copy.deepcopy(pod["endpoints"][0])]
    pod["endpoints"][0]["addresses"] = [host]
    return pools, slices


async def test_a_request_reaches_the_pod_of_a_discovered_pool(node_url: str) -> None:
    api = ReplayApi()
    source = kube_source(api)
    app = build_app(parse_config(CONFIG), source)
    pools, slices = pool_on(node_url)
    body = {"model": "coder", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    async with running(app) as client:
        api.give_list(INFERENCE_POOLS, pools)
        api.give_list(ENDPOINT_SLICES, slices)
        await eventually(lambda: source.synced)
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-tiergate-pool"] == "coder-batched"
        assert r.json()["service_tier"] == "batched"

        # the pod turns unready: the router stops sending to it
        unready = {"type": "MODIFIED", "object": copy.deepcopy(slices["items"][0])}
        unready["object"]["endpoints"][0]["conditions"]["ready"] = False
        unready["object"]["metadata"]["resourceVersion"] = "48300"
        api.give_watch(ENDPOINT_SLICES, unready)
        await eventually(lambda: source.view.endpoints() == [])
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 503, r.text
        assert (await client.get("/readyz")).json()["reason"] == "no usable endpoint"
