"""A tenant sees nothing of another on the tenant-facing port, on real processes; the metrics
port has what monitoring needs.

`tiergate router` (one process on SQLite, and `--workers 2` on PostgreSQL) serves two tenants
that have both been served, one with a budget. Every GET route the router serves (its OpenAPI
document lists them all: the in-process test below holds the two equal), and `/metrics`, asked
with no key and with the first tenant's key, never names the second tenant. The metrics port
names both, with the second's budget and spend, and the fleet's counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling_helpers import until
from process_helpers import Running, start_router
from prometheus_client.parser import text_string_to_metric_families

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.http.openapi import openapi_document
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]

#: The tenant asking, and the one whose name must never reach it (a name no reply or metric
#: could contain by chance).
ASKING, OTHER = "tenant-asking", "tenant-other-7f3c9"
KEYS = {ASKING: "asking-key-0123456789", OTHER: "other-key-0123456789"}
TENANTS = f"""
tenants:
  - {{name: {ASKING}, apiKeys: [{KEYS[ASKING]}]}}
  - {{name: {OTHER}, apiKeys: [{KEYS[OTHER]}], budgetUsd: 1000, budgetPeriod: day}}
"""
CONFIG = """\
router: {{tenantsFile: {tenants}, {ledger}}}
pools:
  - {{name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, servedModelName: coder,
      batching: {{maxNumSeqs: 16}}, endpoints: [{node}]}}
"""
CHAT = {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
#: Paths no route serves, asked too: what a 404 says must not name anyone either.
UNSERVED = ["/metrics", "/v1/usage/someone", "/nothing-here"]
#: The longest a worker's live values may take to reach a scrape (the machine may be busy).
WITHIN_S = 30.0


def bearer(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture
def node(served: Served) -> Iterator[str]:
    serving = ServingSpec(model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec())
    with served(create_app(NodeConfig(serving=serving, served_model_names=["coder"]))) as url:
        yield url


@pytest.fixture(params=["one-process", "two-workers"])
def router(
    request: pytest.FixtureRequest, tmp_path: Path, node: str, pg_dsn: str
) -> Iterator[Running]:
    """The router, after each tenant has been served once."""
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    workers = request.param == "two-workers"
    ledger = f"ledgerUrl: '{pg_dsn}'" if workers else f"ledgerPath: {tmp_path / 'l.sqlite'}"
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG.format(tenants=tmp_path / "tenants.yaml", ledger=ledger, node=node))
    flags = ["--workers", "2"] if workers else []
    running = start_router(config, tmp_path / "router.log", *flags)
    try:
        for tenant in (ASKING, OTHER):
            url = running.url + "/v1/chat/completions"
            reply = httpx.post(url, json=CHAT, headers=bearer(tenant), timeout=60)
            assert reply.status_code == 200, reply.text
        yield running
    finally:
        running.stop()


def test_no_key_and_another_tenant_s_key_see_nothing_of_a_tenant_on_the_tenant_port(
    router: Running,
) -> None:
    document = httpx.get(router.url + "/openapi.json", timeout=30).json()
    served = [path for path, operations in document["paths"].items() if "get" in operations]
    assert {"/v1/usage", "/v1/models", "/healthz", "/readyz", "/openapi.json"} <= set(served)
    for path in served + UNSERVED:
        for method in ("GET", "HEAD"):
            for headers in ({}, bearer(ASKING)):
                reply = httpx.request(method, router.url + path, headers=headers, timeout=30)
                seen = reply.text + " ".join(f"{k}: {v}" for k, v in reply.headers.items())
                assert OTHER not in seen, (method, path, headers, seen)
    usage = httpx.get(router.url + "/v1/usage", headers=bearer(ASKING), timeout=30)
    assert usage.status_code == 200 and usage.json()["tenant"] == ASKING
    metrics = httpx.get(router.url + "/metrics", timeout=30)
    assert metrics.status_code == 404 and metrics.json()["error"]["code"] == "not_found"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(router: Running) -> Samples:
    """The router's metrics port, as (name, sorted labels) -> value."""
    reply = httpx.get(router.metrics_url, timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s series that carry `labels`."""
    return sum(v for (n, found), v in samples.items() if n == name
               and set(labels.items()) <= set(found))  # fmt: skip


def test_the_metrics_port_has_every_tenant_and_the_fleet_s_counts(router: Running) -> None:
    assert router.metrics_url.endswith("/metrics") and router.metrics_url != router.url
    samples = scrape(router)
    assert value(samples, "tiergate_requests_total") == 2  # whichever worker served them
    assert value(samples, "tiergate_tenant_budget_usd", tenant=OTHER) == 1000
    for tenant in (ASKING, OTHER):
        assert value(samples, "tiergate_tenant_attained_tokens_total", tenant=tenant) > 0
    assert ("tiergate_connections_open", ()) in samples
    # A worker's live values (spend read when scraped) reach the others' scrapes within a
    # copy interval (router/http/shared_metrics.py).
    until(
        lambda: value(scrape(router), "tiergate_tenant_budget_spent_usd", tenant=OTHER) > 0,
        "the other tenant's spend is not on the metrics port",
        WITHIN_S,
    )
    elsewhere = httpx.get(router.metrics_url.removesuffix("/metrics") + "/v1/models", timeout=30)
    assert elsewhere.status_code == 404


def test_the_openapi_document_lists_every_route_the_app_serves(tmp_path: Path) -> None:
    """So the walk above, which reads the document, covers every GET route."""
    config = parse_config(
        f"router: {{ledgerPath: {tmp_path / 'l.sqlite'}}}\npools:\n"
        "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
        "endpoints: ['http://127.0.0.1:9']}\n"
    )
    app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
    documented = {
        (method.upper(), path)
        for path, operations in openapi_document()["paths"].items()
        for method in operations
    }
    assert documented == set(app.routes)
    assert ("GET", "/metrics") not in app.routes
