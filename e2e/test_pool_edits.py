"""Pools edited and deleted on a real API server, the operator restarted in between: what the
operator made follows the pool, and the router's routes follow too."""

from __future__ import annotations

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from release import Release
from test_pools import EXAMPLES, POOLS, chat, served_by

from tiergate.pools.rollout import ROLLOUT_STANDS_STILL, ROLLOUT_VALUE

pytestmark = pytest.mark.usefixtures("pools_removed")


@pytest.fixture(scope="module")
def release(module_release: Release) -> Release:
    """One release for the module: each test applies the pools it needs."""
    return module_release


def exported_conditions(release: Release, pool: str) -> dict[str, tuple[str, str]]:
    """type -> (status, reason) of the pool's conditions on the operator's /metrics (one
    operator pod: the release's default)."""
    ((name, ip),) = release.operator_pods(ready=True).items()
    found = {}
    for family in text_string_to_metric_families(release.pod_metrics(name, ip, 8082)):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "tiergate_operator_pool_condition" and labels["pool"] == pool:
                assert labels["pool_namespace"] == release.namespace, labels
                found[labels["type"]] = (labels["status"], labels["reason"])
    return found


def test_deleting_a_pool_removes_its_objects_and_its_routes(release: Release) -> None:
    release.kubectl("apply", "-f", str(EXAMPLES / "premium.yaml"))
    release.wait(lambda: served_by(release, "premium"), "the router to serve premium")
    release.wait(
        lambda: exported_conditions(release, "frontier-premium").get("Ready", ("",))[0] == "True",
        "the operator's metrics to say frontier-premium serves",
    )
    release.kubectl("delete", "inferencepool.tiergate.dev", "frontier-premium")
    release.wait(
        lambda: exported_conditions(release, "frontier-premium") == {},
        "the operator's metrics to forget frontier-premium",
        30,  # well within the 90 s a pool's conditions are kept without a reconciliation
    )
    release.wait(
        lambda: (
            not release.exists("deployment", "frontier-premium")
            and not release.exists("service", "frontier-premium")
        ),
        "garbage collection of the pool's Deployment and Service",
    )
    release.wait(
        lambda: chat(release, "premium").status_code == 404, "the router to stop serving premium"
    )


def test_operator_restarted_while_a_pool_is_edited_converges(release: Release) -> None:
    pool = POOLS["batched"]
    operator = f"{release.name}-operator"
    release.kubectl("apply", "-f", str(EXAMPLES / "batched.yaml"))
    release.wait(lambda: served_by(release, "batched"), "the router to serve batched")
    # Down for certain (not just a pod delete the old process might outlive), edit, back up.
    release.kubectl("scale", "deployment", operator, "--replicas=0")
    release.wait(
        lambda: (
            not release.kubectl(
                "get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "name"
            ).strip()
        ),
        "the operator pod gone",
    )
    release.kubectl(
        "patch", "inferencepool.tiergate.dev", pool, "--type=merge", "-p", '{"spec":{"replicas":2}}'
    )
    time_of_edit = release.get("deployment", pool)["spec"]["replicas"]
    assert time_of_edit == 1, "nothing may act on the edit while the operator is down"
    release.kubectl("scale", "deployment", operator, "--replicas=1")
    release.wait(
        lambda: (
            release.get("deployment", pool)["spec"]["replicas"] == 2
            and release.ready_replicas(pool) == 2
        ),
        "the restarted operator to scale the pool to 2",
        120,
    )


def test_a_pool_s_rollout_reaches_its_deployment_and_restarts_no_pod(release: Release) -> None:
    pool = yaml.safe_load((EXAMPLES / "batched.yaml").read_text())
    pool["metadata"]["name"] = "rolled"
    pool["spec"]["rollout"] = {"maxSurge": 0, "maxUnavailable": 1}
    done = release.apply(yaml.safe_dump(pool))
    assert done.returncode == 0, done.stderr
    release.wait(lambda: release.ready_replicas("rolled") == 1, "pool rolled ready")
    strategy = release.get("deployment", "rolled")["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }, strategy
    pods = set(release.pool_pods("rolled", ready=True))

    # Said no more: Kubernetes' defaults again (the operator's apply no longer owns the
    # field), and the pods keep running: the rollout changes no pod.
    del pool["spec"]["rollout"]
    assert release.apply(yaml.safe_dump(pool)).returncode == 0
    release.wait(
        lambda: (
            release.get("deployment", "rolled")["spec"]["strategy"]["rollingUpdate"]
            == {"maxSurge": "25%", "maxUnavailable": "25%"}
        ),
        "the Deployment back to Kubernetes' rolling update",
    )
    assert set(release.pool_pods("rolled", ready=True)) == pods

    pool["spec"]["rollout"] = {"maxSurge": "0%", "maxUnavailable": 0}
    done = release.apply(yaml.safe_dump(pool))
    assert done.returncode != 0 and ROLLOUT_STANDS_STILL in done.stderr, done.stderr
    pool["spec"]["rollout"] = {"maxSurge": "150%"}
    done = release.apply(yaml.safe_dump(pool))
    assert done.returncode != 0 and ROLLOUT_VALUE in done.stderr, done.stderr
    release.kubectl("delete", "inferencepool.tiergate.dev", "rolled")


def test_replicas_set_on_the_deployment_are_set_back_and_who_set_them_is_told(
    release: Release,
) -> None:
    """`kubectl scale deployment` (as an HPA aimed at the Deployment would) fights the
    operator, which keeps the pool's spec.replicas: it sets them back and names kubectl."""
    pool = POOLS["batched"]
    release.kubectl("apply", "-f", str(EXAMPLES / "batched.yaml"))
    release.wait(lambda: release.ready_replicas(pool) == 1, "the pool's one replica ready")
    release.kubectl("scale", "deployment", pool, "--replicas=3")

    def told() -> list[str]:
        return release.kubectl(
            "get", "events", "--field-selector",
            f"involvedObject.kind=InferencePool,involvedObject.name={pool},"
            "reason=ReplicasOverridden",
            "-o", "jsonpath={range .items[*]}{.message}{'\\n'}{end}",
        ).splitlines()  # fmt: skip

    release.wait(lambda: bool(told()), "a ReplicasOverridden event on the pool")
    assert told()[0].startswith(f"kubectl set Deployment {pool}'s replicas through its scale"), (
        told()
    )
    release.wait(
        lambda: release.get("deployment", pool)["spec"]["replicas"] == 1,
        "the Deployment's replicas back at the pool's 1",
    )
    assert release.get("inferencepool.tiergate.dev", pool)["spec"]["replicas"] == 1
