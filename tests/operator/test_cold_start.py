"""A pool scaled up from zero: the Deployment's controller counts a scale as no rollout
(Progressing stays NewReplicaSetAvailable), yet a real engine's pods load their weights for
minutes. They are starting, not degraded, so the alert on a pool with no ready endpoint holds
(it leaves out Degraded=False Starting); a pool that served and lost its pods is degraded
at once, whatever its new pods do."""

from __future__ import annotations

from typing import Any

from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, conditions, pool, served

from tiergate.operator.kube import PodAddress
from tiergate.operator.reconcile import reconcile

DEPLOYMENT = ("team-a", "frontier-premium")
#: A Deployment scaled up: its controller says nothing about progress.
SCALED = {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}


def degraded(body: dict[str, Any], cluster: FakeCluster) -> tuple[str, str]:
    """Degraded's (status, reason) after a reconciliation; the status kept on `body`."""
    body["status"] = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    found = conditions(body["status"])["Degraded"]
    return found["status"], found["reason"]


def rolled(replicas: int, ready: int = 0) -> dict[str, Any]:
    """A Deployment's status: `replicas` pods of its spec, `ready` of them ready, scaled."""
    return {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas,
            "conditions": [SCALED]}  # fmt: skip


def loading(name: str) -> PodAddress:
    """A pod running whose container has not passed its startup probe."""
    return PodAddress(name, "10.0.0.9", False, starting=True)


def scaled_to_zero(cluster: FakeCluster) -> dict[str, Any]:
    body = pool(replicas=0)
    body["status"] = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert conditions(body["status"])["Ready"]["reason"] == "ScaledToZero"
    return body


def test_a_pool_scaled_up_from_zero_is_starting_while_its_pods_load() -> None:
    cluster = FakeCluster()
    body = scaled_to_zero(cluster)
    body["spec"]["replicas"] = 2
    # The edit's own reconciliation: the Deployment has no pod of it yet.
    cluster.deployments[DEPLOYMENT] = {"replicas": 0, "conditions": [SCALED]}
    assert degraded(body, cluster) == ("False", "Starting")
    cluster.deployments[DEPLOYMENT] = rolled(2)
    cluster.pods[DEPLOYMENT] = [loading("p-0"), loading("p-1")]
    assert degraded(body, cluster) == ("False", "Starting")
    message = conditions(body["status"])["Degraded"]["message"]
    assert message.startswith("0/2 replicas ready: scaled up from zero"), message
    assert degraded(body, cluster) == ("False", "Starting")  # a resync: still on their way
    cluster.deployments[DEPLOYMENT]["readyReplicas"] = 2
    cluster.pods[DEPLOYMENT] = [PodAddress("p-0", "10.0.0.9", True), PodAddress("p-1", "x", True)]
    assert degraded(body, cluster) == ("False", "AsExpected")
    # Served, then lost: degraded, though the new pods are loading again.
    cluster.deployments[DEPLOYMENT]["readyReplicas"] = 0
    cluster.pods[DEPLOYMENT] = [loading("p-0"), loading("p-1")]
    assert degraded(body, cluster) == ("True", "NoReplicaReady")


def test_a_cold_start_with_a_pod_stuck_or_one_that_lost_readiness_is_degraded() -> None:
    for pods, reason in (
        ([loading("p-0"), PodAddress("p-1", None, False, "ErrImagePull: x")], "PodsCannotStart"),
        # Running and past its startup probe, yet not ready: not on its way.
        ([loading("p-0"), PodAddress("p-1", "10.0.0.8", False)], "NoReplicaReady"),
    ):
        cluster = FakeCluster()
        body = scaled_to_zero(cluster)
        body["spec"]["replicas"] = 2
        cluster.deployments[DEPLOYMENT] = rolled(2)
        cluster.pods[DEPLOYMENT] = pods
        assert degraded(body, cluster) == ("True", reason), pods


def test_a_pool_that_served_and_lost_every_pod_is_degraded_at_once() -> None:
    """Its pods replaced (a node gone): the new ones load, but nothing serves where something
    did, which is what the alert is for."""
    cluster = FakeCluster()
    body = served(cluster, pool())
    cluster.deployments[DEPLOYMENT] = rolled(1)
    cluster.pods[DEPLOYMENT] = [loading("p-9")]
    assert degraded(body, cluster) == ("True", "NoReplicaReady")
