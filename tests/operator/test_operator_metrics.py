"""The operator's reconcile metrics: every handler's run counted by result, and served over
HTTP on its own port (kopf exports none)."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import kopf
import pytest
from operator_helpers import CATALOG, IMAGE, FakeCluster, pool
from prometheus_client.parser import text_string_to_metric_families

from tiergate.operator import handlers
from tiergate.operator.metrics import HANDLERS, RESULTS, OperatorMetrics


def counts(metrics: OperatorMetrics) -> dict[tuple[str, str], float]:
    found = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "tiergate_operator_reconciles_total":
                found[(sample.labels["handler"], sample.labels["result"])] = sample.value
    return {key: value for key, value in found.items() if value}


class BrokenCluster(FakeCluster):
    def apply(self, manifest: dict[str, Any]) -> None:
        raise ConnectionError("the API server is down")


def memo(cluster: FakeCluster) -> handlers.OperatorMemo:
    return handlers.OperatorMemo(
        catalog=CATALOG, images=IMAGE, cluster=cluster, warn=lambda *_, **__: None
    )


def test_each_reconciliation_is_counted_by_handler_and_result() -> None:
    ok = memo(FakeCluster())
    handlers.inferencepool_reconcile(body=kopf.Body(pool()), patch=kopf.Patch(), memo=ok)
    handlers.inferencepool_resync(body=kopf.Body(pool()), patch=kopf.Patch(), memo=ok)
    assert counts(ok.metrics) == {("reconcile", "ok"): 1, ("resync", "ok"): 1}

    invalid = memo(FakeCluster())
    with pytest.raises(kopf.PermanentError):
        handlers.inferencepool_reconcile(
            body=kopf.Body(pool(model="gpt-17")), patch=kopf.Patch(), memo=invalid
        )
    assert counts(invalid.metrics) == {("reconcile", "invalid_spec"): 1}

    taken = FakeCluster()
    taken.existing[("Service", "team-a", "frontier-premium")] = {
        "name": "frontier-premium", "namespace": "team-a"}  # fmt: skip
    not_applied = memo(taken)
    handlers.inferencepool_resync(body=kopf.Body(pool()), patch=kopf.Patch(), memo=not_applied)
    assert counts(not_applied.metrics) == {("resync", "not_applied"): 1}

    broken = memo(BrokenCluster())
    with pytest.raises(ConnectionError):
        handlers.inferencepool_resync(body=kopf.Body(pool()), patch=kopf.Patch(), memo=broken)
    assert counts(broken.metrics) == {("resync", "error"): 1}


def test_metrics_are_served_with_every_series_from_the_start() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = OperatorMetrics()
    server = metrics.serve(port, host="127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.shutdown()
        server.server_close()
    series = {
        (s.labels["handler"], s.labels["result"])
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tiergate_operator_reconciles_total"
    }
    assert series == {(h, r) for h in HANDLERS for r in RESULTS}
