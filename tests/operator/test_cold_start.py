"""Pods starting outside a rollout: a pool scaled up from zero, or pods replaced (a node gone).
The Deployment's controller counts neither as a rollout (Progressing stays
NewReplicaSetAvailable), yet a real engine's pods load their weights for minutes. While every
pod not ready is on its way (not created yet, or not past its startup probe) and none for
longer than the Deployment's progress deadline, the pool is starting, not degraded, so the
alert on a pool with no ready endpoint holds (it leaves out Degraded=False Starting). A pod
waiting past that deadline (a volume that never mounts, an image that never comes), one stuck
(ErrImagePull, Unschedulable) or one running past its startup probe without being ready makes
the pool degraded."""

from __future__ import annotations

from typing import Any

import pytest
from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, conditions, pool, served

from tiergate.operator.gpu_pods import PROGRESS_DEADLINE_S
from tiergate.operator.kube import PodAddress
from tiergate.operator.reconcile import reconcile
from tiergate.operator.render import DEFAULT_PROGRESS_DEADLINE_S

DEPLOYMENT = ("team-a", "frontier-premium")
#: A Deployment scaled up: its controller says nothing about progress.
SCALED = {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}


def rolled(replicas: int, ready: int = 0) -> dict[str, Any]:
    """A Deployment's status: `replicas` pods of its spec, `ready` of them ready, scaled."""
    return {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas,
            "conditions": [SCALED]}  # fmt: skip


def loading(name: str, age_s: float = 60.0) -> PodAddress:
    """A pod whose container has not passed its startup probe, `age_s` after its creation."""
    return PodAddress(name, "10.0.0.9", False, starting=True, age_s=age_s)


def degraded(body: dict[str, Any], cluster: FakeCluster) -> tuple[str, str]:
    """Degraded's (status, reason) after a reconciliation; the status kept on `body`."""
    body["status"] = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    found = conditions(body["status"])["Degraded"]
    return found["status"], found["reason"]


def scaled_up(engine: str = "vllm") -> tuple[dict[str, Any], FakeCluster]:
    """A pool of `engine` scaled from zero to two replicas, its Deployment scaled too."""
    cluster = FakeCluster()
    body = pool(replicas=0, engine=engine)
    if engine != "sim":  # real weights: a checkpoint of the pool's model
        body["spec"]["modelSource"] = "example/frontier-fp8"
    body["status"] = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert conditions(body["status"])["Ready"]["reason"] == "ScaledToZero"
    body["spec"]["replicas"] = 2
    cluster.deployments[DEPLOYMENT] = rolled(2)
    return body, cluster


def test_a_pool_scaled_up_from_zero_is_starting_while_its_pods_load() -> None:
    body, cluster = scaled_up()
    cluster.pods[DEPLOYMENT] = [loading("p-0"), loading("p-1")]
    assert degraded(body, cluster) == ("False", "Starting")
    message = conditions(body["status"])["Degraded"]["message"]
    assert message.startswith("0/2 replicas ready: the pods are starting"), message
    assert degraded(body, cluster) == ("False", "Starting")  # a resync: still on their way
    cluster.deployments[DEPLOYMENT]["readyReplicas"] = 2
    cluster.pods[DEPLOYMENT] = [PodAddress("p-0", "x", True), PodAddress("p-1", "y", True)]
    assert degraded(body, cluster) == ("False", "AsExpected")


@pytest.mark.parametrize(
    ("engine", "deadline_s"), [("vllm", PROGRESS_DEADLINE_S), ("sim", DEFAULT_PROGRESS_DEADLINE_S)]
)
def test_a_pod_still_starting_past_the_progress_deadline_is_not_coming(
    engine: str, deadline_s: int
) -> None:
    """ContainerCreating for ever (a volume that never mounts) is no problem a pod says: its
    age ends the wait, at the deadline the Deployment would hold a rollout to."""
    body, cluster = scaled_up(engine)
    cluster.pods[DEPLOYMENT] = [loading("p-0"), loading("p-1", age_s=deadline_s - 1)]
    assert degraded(body, cluster) == ("False", "Starting")
    cluster.pods[DEPLOYMENT] = [loading("p-0"), loading("p-1", age_s=deadline_s)]
    assert degraded(body, cluster) == ("True", "NoReplicaReady")


def test_a_pod_stuck_or_one_that_lost_readiness_makes_it_degraded() -> None:
    for pods, reason in (
        ([loading("p-0"), PodAddress("p-1", None, False, "ErrImagePull: x")], "PodsCannotStart"),
        # Running and past its startup probe, yet not ready: not on its way.
        ([loading("p-0"), PodAddress("p-1", "10.0.0.8", False, age_s=5)], "NoReplicaReady"),
        # Its age not known: not taken to be on its way.
        ([loading("p-0"), PodAddress("p-1", "10.0.0.8", False, starting=True)], "NoReplicaReady"),
    ):
        body, cluster = scaled_up()
        cluster.pods[DEPLOYMENT] = pods
        assert degraded(body, cluster) == ("True", reason), pods


def test_pods_that_cannot_be_listed_are_not_taken_to_be_starting() -> None:
    body, cluster = scaled_up()

    def unlisted(namespace: str, pool: str) -> list[PodAddress]:
        import kopf

        raise kopf.TemporaryError("list pods: HTTP 500")

    cluster.pool_pods = unlisted  # type: ignore[method-assign]
    assert degraded(body, cluster) == ("True", "NoReplicaReady")


def test_a_pool_that_served_and_lost_its_pod_is_starting_while_the_new_one_loads() -> None:
    """Its pod replaced (a node gone): nothing serves until the new one has loaded, which no
    one can hurry; past the progress deadline it is degraded."""
    cluster = FakeCluster()
    body = served(cluster, pool())
    cluster.deployments[DEPLOYMENT] = rolled(1)
    cluster.pods[DEPLOYMENT] = [loading("p-9")]
    assert degraded(body, cluster) == ("False", "Starting")
    cluster.pods[DEPLOYMENT] = [PodAddress("p-9", "10.0.0.9", False, age_s=120)]  # started
    assert degraded(body, cluster) == ("True", "NoReplicaReady")
