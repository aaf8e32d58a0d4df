"""Reconciling a hosted pool (examples/hosted/batched.yaml): no Deployment or Service, Ready by its
provider, and an envelope that states the price instead of predicting one. A pool that was
run by pods and becomes hosted loses its pods."""

from __future__ import annotations

from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, conditions, pool

from tiergate.operator.reconcile import reconcile


def test_a_hosted_pool_gets_no_objects_and_a_stated_envelope() -> None:
    cluster = FakeCluster()
    outcome = reconcile(pool("hosted/batched"), cluster, CATALOG, IMAGE, clock())
    assert cluster.applied == [] and cluster.deleted == []
    status = outcome.status
    assert status["envelope"]["basis"] == "stated"
    assert status["envelope"]["costPerMillionOutputTokensUSD"] == 0.8
    assert status["envelope"]["costPerMillionInputTokensUSD"] == 0.6
    assert status["envelope"]["tokensPerSecondPerStream"] is None  # nothing predicted
    found = conditions(status)
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("True", "Hosted")
    assert "api.example.com" in found["Ready"]["message"]
    assert found["Fits"]["reason"] == "Hosted" and found["Degraded"]["status"] == "False"
    assert outcome.warnings == [] and outcome.permanent_error is None
    assert "sk-" not in str(status)
    assert status["billed"] == {"basis": "stated", "outputPerMillionUsd": 0.8,
                                "inputPerMillionUsd": 0.6}  # fmt: skip


def test_a_hosted_pool_scaled_to_zero_is_not_ready() -> None:
    outcome = reconcile(pool("hosted/batched", replicas=0), FakeCluster(), CATALOG, IMAGE, clock())
    ready = conditions(outcome.status)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero")


def test_a_pool_that_becomes_hosted_loses_its_own_pods_only() -> None:
    cluster = FakeCluster()
    before = pool("hosted/batched")
    name = before["metadata"]["name"]
    owned = {"ownerReferences": [{"kind": "InferencePool", "apiVersion": "tiergate.dev/v1alpha1",
                                  "name": name, "uid": "uid-1", "controller": True}]}  # fmt: skip
    cluster.existing[("Deployment", "team-a", name)] = owned
    cluster.existing[("Service", "team-a", name)] = {"labels": {}}  # someone else's
    reconcile(before, cluster, CATALOG, IMAGE, clock())
    assert cluster.deleted == [("Deployment", "team-a", name)]
