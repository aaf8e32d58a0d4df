"""The operator's reconcile metrics: every handler's run counted by result, and served over
HTTP on its own port (kopf exports none)."""

from __future__ import annotations

from typing import Any

import httpx
import kopf
import pytest
from loopback_ports import free_port
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
    port = free_port()
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


def pool_conditions(metrics: OperatorMetrics) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(namespace, pool, type) -> (status, reason), as /metrics would list them."""
    found = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == "tiergate_operator_pool_condition":
                assert s.value == 1
                key = (s.labels["pool_namespace"], s.labels["pool"], s.labels["type"])
                found[key] = (s.labels["status"], s.labels["reason"])
    return found


def test_a_pool_s_conditions_are_exported_as_each_reconciliation_writes_them() -> None:
    cluster = FakeCluster()
    ran = memo(cluster)
    body = pool()
    cluster.pools[("team-a", "frontier-premium")] = body
    handlers.inferencepool_reconcile(body=kopf.Body(body), patch=kopf.Patch(), memo=ran)
    exported = pool_conditions(ran.metrics)
    assert exported[("team-a", "frontier-premium", "Ready")] == ("False", "ReplicasNotReady")
    assert exported[("team-a", "frontier-premium", "Fits")][0] == "True"
    tiers = {s.labels["tier"] for f in ran.metrics.registry.collect() for s in f.samples
             if s.name == "tiergate_operator_pool_condition"}  # fmt: skip
    assert tiers == {"premium"}

    # The Deployment's controller starts the pods: the Deployment's event says so at once.
    progressing = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 1, "updatedReplicas": 1, "conditions": [progressing]}  # fmt: skip
    owner = {
        "kind": "InferencePool",
        "name": "frontier-premium",
        "apiVersion": "tiergate.dev/v1alpha1",
    }
    deployment = {"metadata": {"name": "frontier-premium", "namespace": "team-a",
                               "ownerReferences": [owner]}}  # fmt: skip
    handlers.deployment_changed(
        event={"type": "MODIFIED"}, body=kopf.Body(deployment), memo=ran
    )  # fmt: skip
    assert pool_conditions(ran.metrics)[("team-a", "frontier-premium", "Degraded")] == (
        "False", "Starting")  # fmt: skip

    # The pods serve: the resync (or the next Deployment event) says so.
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}  # fmt: skip
    handlers.inferencepool_resync(body=kopf.Body(body), patch=kopf.Patch(), memo=ran)
    exported = pool_conditions(ran.metrics)
    assert exported[("team-a", "frontier-premium", "Ready")] == ("True", "Serving")
    assert exported[("team-a", "frontier-premium", "Degraded")] == ("False", "AsExpected")

    handlers.inferencepool_deleted(body=kopf.Body(body), memo=ran)
    assert pool_conditions(ran.metrics) == {}
    # A resync that read the pool before it went, and ends after: it stays gone.
    handlers.inferencepool_resync(body=kopf.Body(body), patch=kopf.Patch(), memo=ran)
    assert pool_conditions(ran.metrics) == {}
    # A new pool of the same name (another uid) is exported.
    again = {**body, "metadata": {**body["metadata"], "uid": "uid-2"}}
    cluster.pools[("team-a", "frontier-premium")] = again
    handlers.inferencepool_resync(body=kopf.Body(again), patch=kopf.Patch(), memo=ran)
    assert pool_conditions(ran.metrics)[("team-a", "frontier-premium", "Ready")][0] == "True"


def test_conditions_no_reconciliation_refreshed_are_left_out() -> None:
    """A replica that lost its peering stands by and reconciles nothing: what it last saw must
    not hold an alert back for ever. A deletion it did not see ages out the same way."""
    now = [1000.0]
    metrics = OperatorMetrics(90.0, clock=lambda: now[0])
    starting = [{"type": "Degraded", "status": "False", "reason": "Starting"}]
    metrics.pool_conditions.record("team-a", "spark-wafer", "wafer-scale", starting)
    metrics.pool_conditions.record("team-b", "spark-wafer", "wafer-scale", starting)
    now[0] += 60.0
    metrics.pool_conditions.record("team-b", "spark-wafer", "wafer-scale", starting)
    now[0] += 60.0  # team-a's: 120 s old; team-b's: 60 s
    assert pool_conditions(metrics) == {
        ("team-b", "spark-wafer", "Degraded"): ("False", "Starting")
    }
