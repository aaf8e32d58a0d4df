"""Outlier ejection through the real router and real sim nodes: one tenant's requests that
fail wherever they go eject no endpoint; an endpoint that fails requests others serve, or
that is gone, is still ejected; the client's 503 names no endpoint.

A request the nodes answer with 500 wherever it goes is made with the sim nodes' fault header
(forwarded to every endpoint here): the same reply a node gives to input it cannot handle. A
broken endpoint is a real sim node that answers every request with 500, and a dead one is a
port nothing listens on.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback_ports import refused_url

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.http.app import RouterApp
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]
KEY = {"authorization": "Bearer batch-key-0123456789"}


def node() -> Any:
    serving = ServingSpec(
        model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec(max_num_seqs=16)
    )
    return create_app(
        NodeConfig(serving=serving, served_model_names=["coder"], fault_header_enabled=True)
    )


def failing_every_request(app: Any) -> Any:
    """A real sim node that answers every request with 500 (its fault header, added here)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, "headers": [*scope["headers"], (b"x-tiergate-fault", b"500")]}
        await app(scope, receive, send)

    return wrapped


@contextmanager
def router(
    served: Served, tmp_path: Path, endpoints: list[str]
) -> Iterator[tuple[RouterApp, str, str]]:
    """A router over one batched pool of `endpoints` (yielded: the app, its URL and its
    metrics port's URL); one tenant, allowed the batched tier
    only; clients' fault headers forwarded to the nodes. No scorers: endpoints come in a
    random (seeded) order whatever their scraped load, or a dead endpoint, its load unknown,
    would rank last once the others' figures are in and be tried only as timing allows."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n  - {name: batch, apiKeys: [batch-key-0123456789], allowedTiers: [batched]}\n"
    )
    config = parse_config(
        f"router: {{tenantsFile: {tenants}, ledgerPath: {tmp_path / 'ledger.sqlite'}, "
        "forwardFaultHeader: true, policy: {scorers: []}}\npools:\n"
        "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
        "servedModelName: coder, batching: {maxNumSeqs: 16}, "
        f"endpoints: {json.dumps(endpoints)}}}\n"
    )
    app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
    with served(app) as url, served(app.metrics_app) as metrics:
        yield app, url, metrics


def chat(i: int, **fields: Any) -> dict[str, Any]:
    # A different prompt each time: prefix affinity would otherwise keep to one endpoint.
    return {"model": "coder", "messages": [{"role": "user", "content": f"task {i}"}], **fields}


def ejected(app: RouterApp) -> list[str]:
    now = app.router.clock()
    return [e.url for e in app.router.view().endpoints() if e.is_ejected(now)]


def test_a_tenant_s_requests_that_fail_everywhere_eject_no_endpoint(
    served: Served, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        nodes = [stack.enter_context(served(node())) for _ in range(2)]
        app, url, metrics_port = stack.enter_context(router(served, tmp_path, nodes))
        for i in range(10):
            r = httpx.post(
                url + "/v1/chat/completions",
                json=chat(i, max_tokens=2),
                headers={**KEY, "x-tiergate-fault": "500"},
                timeout=30,
            )
            assert r.status_code == 503, r.text
            assert r.json()["error"] == {
                "message": "no endpoint of the batched tier could serve the request after "
                "2 attempt(s); last: HTTP 500",
                "type": "server_error",
                "code": "upstream_unavailable",
                "param": None,
            }
            assert not any(node_url in r.text for node_url in nodes)
        assert ejected(app) == []
        metrics = httpx.get(metrics_port + "/metrics").text
        assert 'tiergate_endpoints{state="ready",tier="batched"} 2.0' in metrics
        for i in range(4):  # and every request that can be served is, on its first attempt
            r = httpx.post(url + "/v1/chat/completions", json=chat(i, max_tokens=2), headers=KEY)
            assert r.status_code == 200, r.text
    rows = list(
        sqlite3.connect(tmp_path / "ledger.sqlite").execute(
            "select outcome, http_status, cost_usd, endpoint from usage order by rowid"
        )
    )
    # The attempts that failed are on record, at no cost, saying what happened.
    assert rows[:10] == [("upstream_error", 503, 0.0, None)] * 10
    assert all(row[:2] == ("ok", 200) and row[3] in nodes for row in rows[10:])


def test_too_deep_a_tool_schema_is_the_client_s_400_and_ejects_no_endpoint(
    served: Served, tmp_path: Path
) -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(150):
        schema = {"type": "object", "properties": {"x": schema}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    with ExitStack() as stack:
        nodes = [stack.enter_context(served(node())) for _ in range(2)]
        app, url, _ = stack.enter_context(router(served, tmp_path, nodes))
        with httpx.Client(base_url=url, headers=KEY, timeout=30) as client:
            for i in range(10):
                r = client.post("/v1/chat/completions", json=chat(i, tools=tools))
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == "tools.0.function.parameters"
                # the next request, maybe on the node connection the last one used, is served
                ok = client.post("/v1/chat/completions", json=chat(i, max_tokens=2))
                assert ok.status_code == 200, ok.text
        assert ejected(app) == []


@pytest.mark.parametrize("broken", ["answers 500", "is gone"])
def test_an_endpoint_that_fails_what_others_serve_is_still_ejected(
    served: Served, tmp_path: Path, broken: str
) -> None:
    with ExitStack() as stack:
        healthy = stack.enter_context(served(node()))
        if broken == "answers 500":
            bad = stack.enter_context(served(failing_every_request(node())))
        else:
            bad = refused_url()
        app, url, _ = stack.enter_context(router(served, tmp_path, [bad, healthy]))
        with httpx.Client(base_url=url, headers=KEY, timeout=30) as client:
            for i in range(200):  # 5 in a row to the broken one first ejects it
                r = client.post("/v1/chat/completions", json=chat(i, max_tokens=1))
                assert r.status_code == 200, r.text  # retried on the healthy one
                if ejected(app):
                    break
        assert ejected(app) == [bad]


def retries_total(metrics_port: str) -> float:
    line = next(
        line
        for line in httpx.get(metrics_port + "/metrics").text.splitlines()
        if line.startswith("tiergate_upstream_retries_total")
    )
    return float(line.split()[-1])


def test_the_retries_of_a_request_that_failed_are_counted(served: Served, tmp_path: Path) -> None:
    with ExitStack() as stack:
        nodes = [stack.enter_context(served(node())) for _ in range(2)]
        _, url, metrics_port = stack.enter_context(router(served, tmp_path, nodes))
        for i in range(3):
            r = httpx.post(
                url + "/v1/chat/completions",
                json=chat(i, max_tokens=2),
                headers={**KEY, "x-tiergate-fault": "500"},
                timeout=30,
            )
            assert r.status_code == 503
        assert retries_total(metrics_port) == 3  # each tried both endpoints
        r = httpx.post(url + "/v1/chat/completions", json=chat(9, max_tokens=2), headers=KEY)
        assert r.status_code == 200
        assert retries_total(metrics_port) == 3
