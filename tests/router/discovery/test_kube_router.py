"""The router app on Kubernetes discovery: readiness, and requests reaching discovered pods."""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from kube_helpers import (
    ReplayApi,
    eventually,
    kube_source,
    recorded,
    running,
    set_ready,
    watch_event,
)

from tiergate.pools import SERVES_ANNOTATION, serves_annotation
from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.kube_state import INFERENCE_POOLS, PODS
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

CONFIG = "router: {ledgerPath: ':memory:', scrapeIntervalS: 30}\ndiscovery: {kubernetes: {}}"


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

        api.give_list(PODS, recorded("pods_list"))
        await eventually(lambda: app.synced())
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["endpoints"] == 3
        models = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m["tiers"]) for m in models] == [("coder", ["batched", "premium"])]


async def test_readyz_in_a_cluster_without_pools_is_ready_once_synced() -> None:
    """`helm install --wait` must end before anyone has applied a pool."""
    api = ReplayApi()
    app = build_app(parse_config(CONFIG), kube_source(api))
    empty = {"kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}
    async with running(app) as client:
        api.give_list(INFERENCE_POOLS, empty)
        api.give_list(PODS, empty)
        await eventually(lambda: app.synced())
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["endpoints"] == 0


@pytest.fixture
def node_url(served: Callable[[Any], AbstractContextManager[str]]) -> Any:
    serving = ServingSpec(
        model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec(max_num_seqs=16)
    )
    with served(create_app(NodeConfig(serving=serving, served_model_names=["coder"]))) as url:
        yield url


def pool_on(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An InferencePools list and a pods list for one pool whose one pod is `url`.

    The pod's IP is loopback, as kwok's are: fine for pods (EndpointSlices refuse it).
    """
    pools = recorded("inferencepools_list")
    pools["items"] = pools["items"][:1]
    pools["items"][0]["spec"].update(accelerator="wse-3", chips="auto")
    pods = recorded("pods_list")
    pods["items"] = pods["items"][:1]
    pod = pods["items"][0]
    host, port = url.removeprefix("http://").split(":")
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = int(port)
    pod["status"]["podIP"] = host
    pod["status"]["podIPs"] = [{"ip": host}]
    return pools, pods


async def test_a_request_reaches_the_pod_of_a_discovered_pool(node_url: str) -> None:
    api = ReplayApi()
    source = kube_source(api)
    app = build_app(parse_config(CONFIG), source)
    pools, pods = pool_on(node_url)
    body = {"model": "coder", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    async with running(app) as client:
        api.give_list(INFERENCE_POOLS, pools)
        api.give_list(PODS, pods)
        await eventually(lambda: source.synced)
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-tiergate-pool"] == "coder-batched"
        assert r.json()["service_tier"] == "default"

        # the pod turns unready: the router stops sending to it
        unready = watch_event("MODIFIED", pods["items"][0], "48300")
        set_ready(unready["object"], "False")
        api.give_watch(PODS, unready)
        await eventually(lambda: source.view.endpoints() == [])
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 503, r.text
        # Still ready: in a cluster pools and endpoints come and go; the router keeps its
        # place in its Service and answers each request with a clear error meanwhile.
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["endpoints"] == 0


async def test_a_name_a_pool_is_rolling_out_to_is_a_503_with_retry_after(node_url: str) -> None:
    """The pool's spec now says `coder-2`; its one pod still runs the previous spec and answers
    to `coder` only, and the pod made for `coder-2` is not ready yet: `coder-2` is on its way
    (503, retry), not a client's mistake, and `coder` is served until its pod goes."""
    api = ReplayApi()
    source = kube_source(api)
    app = build_app(parse_config(CONFIG), source)
    pools, pods = pool_on(node_url)
    pod = pods["items"][0]
    pod["metadata"]["annotations"] = {SERVES_ANNOTATION: serves_annotation(["coder"])}
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    async with running(app) as client:
        api.give_list(INFERENCE_POOLS, pools)
        api.give_list(PODS, pods)
        await eventually(lambda: source.synced)
        renamed = copy.deepcopy(pools["items"][0])
        renamed["spec"]["servedModelName"] = "coder-2"
        api.give_watch(INFERENCE_POOLS, watch_event("MODIFIED", renamed, "48301"))
        await eventually(lambda: "coder-2" in source.view.models_served())
        for headers in ({}, {"x-tiergate-tier": "batched"}):
            r = await client.post(
                "/v1/chat/completions", json={**body, "model": "coder-2"}, headers=headers
            )
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "no_capacity"
        r = await client.post("/v1/chat/completions", json={**body, "model": "coder"})
        assert r.status_code == 200, r.text
