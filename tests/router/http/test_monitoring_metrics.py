"""The metrics the dashboard and alerts read that the router derives: each tenant's budget and
its spend in the period, and each pool's endpoints by state (zeros included)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tenant_router_helpers import KEY, tenant_router

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.sim_nodes.catalogs import default_catalog


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """`name`'s samples in an exposition, by their sorted labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_budget_and_spend_of_a_tenant_are_exported(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> None:
    with (
        tenant_router(
            served,
            tmp_path / "ledger.sqlite",
            tmp_path,
            budget="budgetUsd: 5, budgetPeriod: day",
            pool="billing: {outputPerMillionUsd: 1000000}",  # $1 an output token
        ) as (app, url),
        served(app.metrics_app) as metrics,
    ):
        key = (("period", "day"), ("tenant", "alice"))
        before = httpx.get(metrics + "/metrics").text
        assert samples(before, "tiergate_tenant_budget_usd") == {key: 5.0}
        assert samples(before, "tiergate_tenant_budget_spent_usd") == {key: 0.0}
        body = {"model": "coder", "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
        reply = httpx.post(url + "/v1/completions", json=body, headers=KEY, timeout=60)
        assert reply.status_code == 200
        after = httpx.get(metrics + "/metrics").text
        assert samples(after, "tiergate_tenant_budget_spent_usd") == {key: 2.0}


CONFIG = """
pools:
  - {name: alive, tier: batched, model: llama-3.1-8b, accelerator: wse-3, endpoints: [URL]}
  - {name: empty, tier: premium, model: llama-3.1-8b, accelerator: wse-3, endpoints: [],
     batching: {maxNumSeqs: 4}}
"""


def test_every_pool_lists_every_state_zeros_included(tmp_path: Path) -> None:
    """A pool with no endpoint shows ready=0 rather than no series, and an endpoint whose
    scrapes fail is unreachable, not ready: that is what the no-ready-endpoint alert reads."""
    text = CONFIG.replace("URL", "http://127.0.0.1:9")
    config = parse_config(f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}}}\n{text}", "t")
    view = build_view(config.pools, default_catalog())
    app = build_app(config, StaticSource(view))
    endpoint = view.endpoints()[0]
    endpoint.scrape_failures = 1
    text = app.metrics.exposition().decode()
    found = samples(text, "tiergate_pool_endpoints")
    states = {(dict(k)["pool"], dict(k)["state"]): v for k, v in found.items()}
    assert states == {
        ("alive", "ready"): 0, ("alive", "ejected"): 0, ("alive", "unreachable"): 1,
        ("empty", "ready"): 0, ("empty", "ejected"): 0, ("empty", "unreachable"): 0,
    }  # fmt: skip
    endpoint.scrape_failures = 0
    found = samples(app.metrics.exposition().decode(), "tiergate_pool_endpoints")
    assert found[(("pool", "alive"), ("state", "ready"), ("tier", "batched"))] == 1


def test_shed_and_spill_series_exist_at_zero_before_their_first_event(tmp_path: Path) -> None:
    """rate() and increase() need a sample before an event to count it."""
    config = parse_config(f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}}}\npools: []", "t")
    app = build_app(config, StaticSource(build_view([], default_catalog())))
    text = app.metrics.exposition().decode()
    shed = samples(text, "tiergate_shed_total")
    assert len(shed) == 9 and set(shed.values()) == {0.0}  # 3 tiers x 3 priorities
    spills = samples(text, "tiergate_spills_total")
    assert len(spills) == 12 and set(spills.values()) == {0.0}  # 6 tier pairs x 2 reasons
