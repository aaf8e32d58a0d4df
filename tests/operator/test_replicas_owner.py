"""Someone else sets a pool's Deployment's replicas (an HPA aimed at the Deployment, `kubectl
scale deployment`): the operator reads who from the Deployment's managedFields, sets them
back, and says so once in a while, not at every round of the fight."""

from __future__ import annotations

from typing import Any

import kopf
from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, pool
from prometheus_client import generate_latest

from tiergate.operator import handlers
from tiergate.operator.reconcile import reconcile
from tiergate.operator.render import FIELD_MANAGER
from tiergate.operator.replicas_owner import replicas_override

APPLIED = "2026-11-30T02:00:00Z"


def entry(manager: str, time: str, *, replicas: bool = True, **extra: Any) -> dict[str, Any]:
    """A managedFields entry as the API server writes it."""
    spec: dict[str, Any] = {"f:template": {}}
    if replicas:
        spec["f:replicas"] = {}
    return {"manager": manager, "operation": extra.pop("operation", "Update"),
            "apiVersion": "apps/v1", "time": time, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": spec}, **extra}  # fmt: skip


def own(time: str = APPLIED) -> dict[str, Any]:
    return entry(FIELD_MANAGER, time, operation="Apply")


def hpa(time: str) -> dict[str, Any]:
    return entry("kube-controller-manager", time, subresource="scale")


def test_only_the_operator_setting_replicas_is_no_override() -> None:
    assert replicas_override({"managedFields": [own()]}, "p", 2) is None
    assert replicas_override(None, "p", 2) is None
    # Another manager of other fields (a label added by hand) did not touch the replicas.
    edited = entry("kubectl-label", "2026-11-30T02:05:00Z", replicas=False)
    assert replicas_override({"managedFields": [own(), edited]}, "p", 2) is None


def test_an_hpa_on_the_deployment_after_the_operator_s_apply_is_named() -> None:
    found = replicas_override({"managedFields": [own(), hpa("2026-11-30T02:01:00Z")]}, "p", 2)
    assert found is not None
    assert (found.manager, found.subresource, found.time) == (
        "kube-controller-manager", "scale", "2026-11-30T02:01:00Z")  # fmt: skip
    message = found.message
    assert "kube-controller-manager set Deployment p's replicas through its scale" in message
    assert "spec.replicas (2)" in message and "kubectl scale inferencepool/p" in message


def test_the_latest_of_several_is_named_and_one_before_the_operator_s_apply_is_not() -> None:
    fields = [
        own(),
        entry("kubectl", "2026-11-30T02:03:00Z", subresource="scale"),
        hpa("2026-11-30T02:02:00Z"),
    ]
    found = replicas_override({"managedFields": fields}, "p", 1)
    assert found is not None and found.manager == "kubectl"
    # Set before the operator's last apply (which a value equal to theirs leaves shared).
    before = [own("2026-11-30T02:10:00Z"), hpa("2026-11-30T02:02:00Z")]
    assert replicas_override({"managedFields": before}, "p", 1) is None


def deployed(cluster: FakeCluster, *fields: dict[str, Any]) -> dict[str, Any]:
    """The premium pool, applied once; its Deployment's managedFields then `fields`."""
    body = pool()
    cluster.pools[("team-a", "frontier-premium")] = body
    reconcile(body, cluster, CATALOG, IMAGE, clock())
    meta = cluster.existing[("Deployment", "team-a", "frontier-premium")]
    meta["managedFields"] = list(fields)
    return body


def test_a_reconciliation_sets_the_replicas_back_and_reports_who_set_them() -> None:
    cluster = FakeCluster()
    body = deployed(cluster, own(), hpa("2026-11-30T02:01:00Z"))
    outcome = reconcile(body, cluster, CATALOG, IMAGE, clock())
    assert outcome.override is not None and outcome.override.manager == "kube-controller-manager"
    (*_, applied) = (m for m in cluster.applied if m["kind"] == "Deployment")
    assert applied["spec"]["replicas"] == body["spec"]["replicas"] == outcome.override.replicas
    # The apply took the field back (the fake keeps the manifest's metadata, no entry).
    assert reconcile(body, cluster, CATALOG, IMAGE, clock()).override is None


def test_a_fight_is_warned_of_once_a_period_and_counted_each_round() -> None:
    events: list[tuple[str, str]] = []
    now = [1000.0]
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(
        catalog=CATALOG, images=IMAGE, cluster=cluster,
        warn=lambda body, reason, message: events.append((reason, message)),
        monotonic=lambda: now[0],
    )  # fmt: skip
    deployment = kopf.Body({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "frontier-premium", "namespace": "team-a", "ownerReferences": [
            {"apiVersion": "tiergate.dev/v1alpha1", "kind": "InferencePool",
             "name": "frontier-premium", "uid": "uid-1"}]}})  # fmt: skip

    def round_of_the_fight(time: str) -> None:
        meta = cluster.existing[("Deployment", "team-a", "frontier-premium")]
        meta["managedFields"] = [own(), hpa(time)]
        handlers.deployment_changed(event={"type": "MODIFIED"}, body=deployment, memo=memo)

    deployed(cluster)
    round_of_the_fight("2026-11-30T02:01:00Z")
    assert [reason for reason, _ in events] == ["ReplicasOverridden"]
    assert "kube-controller-manager" in events[0][1]
    now[0] += 15
    round_of_the_fight("2026-11-30T02:01:15Z")  # the HPA's next sync: counted, not posted
    assert len(events) == 1
    now[0] += handlers.OVERRIDE_WARN_EVERY_S
    round_of_the_fight("2026-11-30T02:11:15Z")
    assert len(events) == 2
    text = generate_latest(memo.metrics.registry).decode()
    counted = [line for line in text.splitlines()
               if line.startswith("tiergate_operator_replicas_overridden_total{")]  # fmt: skip
    assert counted == [
        'tiergate_operator_replicas_overridden_total{manager="kube-controller-manager",'
        'pool="frontier-premium",pool_namespace="team-a"} 3.0'
    ], text
