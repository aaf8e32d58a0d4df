"""Reconciling pools against a fake cluster: objects applied with owner references, status and
conditions the Kubernetes way, misfits and spec errors reported without Deployments, and the
same result every time (level-based)."""

from __future__ import annotations

import json
import logging
from typing import Any

import kopf
import pytest
from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, conditions, edit, pool, served

from tiergate.operator import handlers
from tiergate.operator.kube import PodAddress
from tiergate.operator.reconcile import reconcile
from tiergate.operator.render import GENERATION_ANNOTATION


def test_a_fitting_pool_gets_its_objects_and_envelope() -> None:
    cluster = FakeCluster()
    outcome = reconcile(pool(), cluster, CATALOG, IMAGE, clock())
    kinds = [(m["kind"], m["metadata"]["name"]) for m in cluster.applied]
    assert kinds == [("Deployment", "frontier-premium"), ("Service", "frontier-premium")]
    for manifest in cluster.applied:
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert owner["uid"] == "uid-1" and owner["controller"] is True
    status = outcome.status
    assert status["observedGeneration"] == 3
    assert status["envelope"]["tokensPerSecondPerStream"] > 100
    assert status["envelope"]["costPerMillionOutputTokensUSD"] > 0
    assert status["selector"] == (
        "app.kubernetes.io/name=tiergate-sim-node,tiergate.dev/pool=frontier-premium")  # fmt: skip
    c = conditions(status)
    assert c["Fits"]["status"] == "True"
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReplicasNotReady")
    assert c["Progressing"]["status"] == "True"
    assert outcome.warnings == [] and outcome.permanent_error is None


def test_premium_envelope_shows_the_seed_ratios_next_to_batched() -> None:
    """2.5x the speed at ~6x the cost: out of the model, through the operator's status."""
    batched = reconcile(pool("batched"), FakeCluster(), CATALOG, IMAGE, clock()).status
    premium = reconcile(pool("premium"), FakeCluster(), CATALOG, IMAGE, clock()).status
    speed = (premium["envelope"]["tokensPerSecondPerStream"]
             / batched["envelope"]["tokensPerSecondPerStream"])  # fmt: skip
    cost = (premium["envelope"]["costPerMillionOutputTokensUSD"]
            / batched["envelope"]["costPerMillionOutputTokensUSD"])  # fmt: skip
    assert 2.2 < speed < 2.8 and 5 < cost < 7


def test_ready_replicas_make_it_ready_and_transition_times_move_only_on_change() -> None:
    cluster = FakeCluster()
    now = clock()
    body = pool()
    first = reconcile(body, cluster, CATALOG, IMAGE, now).status
    body["status"] = first
    again = reconcile(body, cluster, CATALOG, IMAGE, now).status
    assert conditions(again)["Ready"]["lastTransitionTime"] == conditions(first)["Ready"][
        "lastTransitionTime"]  # fmt: skip
    assert cluster.applied[:2] == cluster.applied[2:]  # the same objects: idempotent
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}  # fmt: skip
    body["status"] = again
    ready = reconcile(body, cluster, CATALOG, IMAGE, now).status
    c = conditions(ready)
    assert (c["Ready"]["status"], c["Progressing"]["status"]) == ("True", "False")
    assert c["Ready"]["lastTransitionTime"] != conditions(again)["Ready"]["lastTransitionTime"]
    assert c["Fits"]["lastTransitionTime"] == conditions(first)["Fits"]["lastTransitionTime"]
    assert (ready["replicas"], ready["readyReplicas"]) == (1, 1)


def test_a_model_that_does_not_fit_gets_no_deployment_and_the_numbers() -> None:
    cluster = FakeCluster()
    outcome = reconcile(pool(chips=1, tensorParallel=1), cluster, CATALOG, IMAGE, clock())
    assert cluster.applied == []
    fits = conditions(outcome.status)["Fits"]
    assert (fits["status"], fits["reason"]) == ("False", "ModelDoesNotFit")
    assert "GB per chip" in fits["message"] and "b200" in fits["message"]
    assert outcome.warnings[0][0] == "ModelDoesNotFit"
    assert outcome.status["envelope"] is None and outcome.permanent_error is None


def test_status_says_what_tenants_pay_beside_the_predicted_cost() -> None:
    predicted = reconcile(pool(), FakeCluster(), CATALOG, IMAGE, clock()).status
    cost = predicted["envelope"]["costPerMillionOutputTokensUSD"]
    assert predicted["billed"] == {"basis": "predicted", "outputPerMillionUsd": cost,
                                   "inputPerMillionUsd": 0.0}  # fmt: skip
    billing = {"outputPerMillionUsd": cost * 3, "inputPerMillionUsd": 1.5}
    stated = reconcile(pool(billing=billing), FakeCluster(), CATALOG, IMAGE, clock()).status
    assert stated["envelope"]["costPerMillionOutputTokensUSD"] == cost  # the hardware's cost
    assert stated["billed"] == {"basis": "stated", "outputPerMillionUsd": cost * 3,
                                "inputPerMillionUsd": 1.5}  # fmt: skip
    # Only a prompt price stated: output tokens are billed at the predicted cost.
    prompts = reconcile(pool(billing={"inputPerMillionUsd": 2}), FakeCluster(), CATALOG, IMAGE,
                        clock()).status  # fmt: skip
    assert prompts["billed"] == {"basis": "predicted", "outputPerMillionUsd": cost,
                                 "inputPerMillionUsd": 2.0}  # fmt: skip


def test_a_pool_that_does_not_fit_bills_nothing_in_status() -> None:
    outcome = reconcile(pool(chips=1, tensorParallel=1), FakeCluster(), CATALOG, IMAGE, clock())
    assert outcome.status["billed"] is None  # null: a merge patch deletes an earlier price


#: The premium example with Llama 3.1 405B on H100s, sized by the model (fp8 weights: 8 chips).
REAL_405B = {"model": "llama-3.1-405b", "accelerator": "h100-sxm", "chips": "auto",
             "tensorParallel": None, "background": None}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model": "gpt-17"}, "gpt-17"),
        ({"accelerator": "tpu-v9"}, "tpu-v9"),
        ({"batching": {"maxNumSeqs": "lots"}}, "batching.maxNumSeqs"),
        # the node would refuse to start: its pods would crash-loop, the reason in their log
        ({"batching": {"maxNumSeqs": 4}, "background": {"sequences": 4, "contextTokens": 1000}},
         "background: 4 resident sequences leave no batch slot"),
        ({"chips": 2, "tensorParallel": 2, "batching": {"maxNumSeqs": 16},
          "background": {"sequences": 15, "contextTokens": 100_000}},
         "tokens of KV cache but the replica holds"),
        ({"background": {"sequences": 2, "contextTokens": 300_000}},
         "background sequences of 300000 tokens exceed the 200000-token context"),
        ({"background": {"sequences": 2, "contextTokens": 10, "turnInputTokens": 50,
                         "turnOutputTokens": 10}},
         "background: a background turn (50 tokens) cannot exceed the background context"),
        ({"background": {"sequences": 2, "contextTokens": 100, "turnInputTokens": 50}},
         "background turns need turn_output_tokens of at least 1"),
        # a real engine's replica over more GPUs than a node has: one pod could never schedule
        ({**REAL_405B, "engine": "vllm", "weightDtype": "bf16"},
         "a replica of 16 x h100-sxm spans 2 nodes of 8, and a vllm replica runs in one pod"),
        ({**REAL_405B, "engine": "sglang", "chips": 16}, "spans 2 nodes of 8"),
    ],
)  # fmt: skip
def test_spec_errors_the_schema_cannot_catch_are_permanent(
    changes: dict[str, Any], words: str
) -> None:
    cluster = FakeCluster()
    outcome = reconcile(pool(**changes), cluster, CATALOG, IMAGE, clock())
    assert cluster.applied == []
    ready = conditions(outcome.status)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert outcome.permanent_error is not None and words in outcome.permanent_error


def test_a_sim_pool_over_several_systems_rolls_out_and_a_real_engine_within_a_node_too() -> None:
    """A sim node needs no GPU: it simulates a replica over several systems in one pod."""
    for changes in ({**REAL_405B, "weightDtype": "bf16"}, {**REAL_405B, "engine": "vllm"}):
        cluster = FakeCluster()
        outcome = reconcile(pool(**changes), cluster, CATALOG, IMAGE, clock())
        assert outcome.permanent_error is None and len(cluster.applied) == 2


def test_slo_the_envelope_misses_is_flagged_on_ready() -> None:
    cluster = FakeCluster()
    cluster.deployments[("team-a", "frontier-batched")] = {
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}  # fmt: skip
    body = pool("batched", slo={"tpotMs": 5})
    ready = conditions(reconcile(body, cluster, CATALOG, IMAGE, clock()).status)["Ready"]
    assert ready["reason"] == "SloAtRisk" and "TPOT" in ready["message"]


# -- objects the operator may not apply -------------------------------------------------------


def _foreign(cluster: FakeCluster, kind: str, **meta: Any) -> None:
    cluster.existing[(kind, "team-a", "frontier-premium")] = {
        "name": "frontier-premium", "namespace": "team-a", **meta}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "meta", "whose"),
    [
        ("Service", {"labels": {"app": "billing"}}, "it has no controller"),
        (
            "Deployment",
            {
                "ownerReferences": [
                    {
                        "apiVersion": "argoproj.io/v1alpha1",
                        "kind": "Rollout",
                        "name": "billing",
                        "uid": "u-9",
                        "controller": True,
                    }
                ]
            },
            "it is controlled by Rollout billing",
        ),  # fmt: skip
    ],
)
def test_another_apps_object_with_the_pools_name_is_left_alone_and_said_once(
    kind: str, meta: dict[str, Any], whose: str
) -> None:
    """Server-side apply with force would take it over, and deleting the pool would then
    garbage-collect it: the pool says so instead, and applies once it is out of the way."""
    cluster = FakeCluster()
    _foreign(cluster, kind, **meta)
    body = pool()
    outcome = reconcile(body, cluster, CATALOG, IMAGE, clock())
    assert cluster.applied == []  # not even the object that was free
    c = conditions(outcome.status)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "NameTaken")
    assert f"{kind} team-a/frontier-premium already exists" in c["Ready"]["message"]
    assert whose in c["Ready"]["message"]
    assert (c["Fits"]["status"], c["Progressing"]["status"]) == ("True", "False")
    assert outcome.alerts == [("NameTaken", c["Ready"]["message"])]
    assert outcome.permanent_error == c["Ready"]["message"]
    assert outcome.status["envelope"]["tokensPerSecondPerStream"] > 0

    body["status"] = outcome.status  # the resync timer finds it again: no second event
    again = reconcile(body, cluster, CATALOG, IMAGE, clock())
    assert again.alerts == [] and cluster.applied == []

    del cluster.existing[(kind, "team-a", "frontier-premium")]  # its owner removed it
    reconcile(body, cluster, CATALOG, IMAGE, clock())
    assert [m["kind"] for m in cluster.applied] == ["Deployment", "Service"]


@pytest.mark.parametrize(
    "meta",
    [
        # a deleted pool of the same name: garbage collection has not removed its objects yet
        {"ownerReferences": [{"apiVersion": "tiergate.dev/v1alpha1", "kind": "InferencePool",
                              "name": "frontier-premium", "uid": "uid-0", "controller": True}]},
        # orphaned (`kubectl delete --cascade=orphan`): the pool's label, no controller
        {"labels": {"tiergate.dev/pool": "frontier-premium"}},
    ],
)  # fmt: skip
def test_the_pools_own_objects_from_before_are_taken_back(meta: dict[str, Any]) -> None:
    cluster = FakeCluster()
    _foreign(cluster, "Deployment", **meta)
    outcome = reconcile(pool(), cluster, CATALOG, IMAGE, clock())
    assert [m["kind"] for m in cluster.applied] == ["Deployment", "Service"]
    assert outcome.alerts == [] and outcome.permanent_error is None


def test_a_manifest_the_api_server_rejects_is_said_once_and_not_retried() -> None:
    """E.g. a template resource quantity the schema let through: the running pods stay, and
    the status says both, as for a spec the operator refuses (test_refusals): Ready about the
    previous generation, whose pods serve, and Progressing why the new one is not rolled out."""
    cluster = FakeCluster()
    body = edit(served(cluster, pool()), {"batching": {"maxNumSeqs": 8}})
    cluster.rejects["Deployment"] = (
        "the API server rejected Deployment team-a/frontier-premium: quantities must match"
    )
    outcome = reconcile(body, cluster, CATALOG, IMAGE, clock())
    c = conditions(outcome.status)
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "ApplyRejected")
    assert c["Progressing"]["message"] == (
        "not rolled out: the API server rejected Deployment team-a/frontier-premium: "
        "quantities must match; what ran before runs on"
    )
    assert c["Progressing"]["observedGeneration"] == 4
    ready = c["Ready"]  # what ran before still serves, and Ready is about it
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "True", "ServingPreviousSpec", 3)  # fmt: skip
    assert "(ApplyRejected): see Progressing" in ready["message"]
    assert [reason for reason, _ in outcome.alerts] == ["ApplyRejected"]
    assert outcome.permanent_error is not None and "quantities" in outcome.permanent_error
    body["status"] = outcome.status
    assert reconcile(body, cluster, CATALOG, IMAGE, clock()).alerts == []
    del cluster.rejects["Deployment"]  # the spec was mended
    mended = conditions(reconcile(body, cluster, CATALOG, IMAGE, clock()).status)
    assert (mended["Progressing"]["reason"], mended["Ready"]["reason"]) == ("Settled", "Serving")
    assert mended["Ready"]["observedGeneration"] == 4


def test_a_manifest_rejected_with_no_pod_serving_is_not_ready_and_said_once() -> None:
    cluster = FakeCluster()
    cluster.rejects["Deployment"] = "the API server rejected Deployment team-a/x: no"
    body = pool()
    outcome = reconcile(body, cluster, CATALOG, IMAGE, clock())
    c = conditions(outcome.status)
    assert {k: (v["status"], v["reason"]) for k, v in c.items() if k != "Fits"} == {
        "Ready": ("False", "ApplyRejected"),
        "Progressing": ("False", "ApplyRejected"),
        "Degraded": ("Unknown", "ApplyRejected"),
    }
    assert outcome.alerts == [("ApplyRejected", c["Progressing"]["message"])]
    body["status"] = outcome.status
    assert reconcile(body, cluster, CATALOG, IMAGE, clock()).alerts == []


def test_a_service_rejected_after_the_deployment_says_what_was_applied() -> None:
    cluster = FakeCluster()
    cluster.rejects["Service"] = "the API server rejected Service team-a/frontier-premium: no"
    outcome = reconcile(pool(), cluster, CATALOG, IMAGE, clock())
    assert [m["kind"] for m in cluster.applied] == ["Deployment"]
    c = conditions(outcome.status)
    assert c["Progressing"]["message"] == (
        "the API server rejected Service team-a/frontier-premium: no "
        "(applied before it: Deployment team-a/frontier-premium)"
    )
    # no Deployment status yet (it was just created): Ready says why too, not "0/1 ready"
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ApplyRejected")


@pytest.mark.parametrize(
    ("changes", "reason", "fits"),
    [
        ({"model": "gpt-17"}, "InvalidSpec", "Unknown"),
        ({"chips": 1, "tensorParallel": 1}, "ModelDoesNotFit", "False"),
    ],
)
def test_an_edit_that_cannot_run_leaves_no_condition_of_the_spec_before(
    changes: dict[str, Any], reason: str, fits: str
) -> None:
    """The performance model cannot evaluate the spec: the router drops the pool too, so the
    earlier spec's pods serve nothing (test_refusals: the edits the router still routes)."""
    cluster = FakeCluster()
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}  # fmt: skip
    body = pool()
    body["status"] = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert conditions(body["status"])["Ready"]["status"] == "True"
    body["spec"].update(changes)
    c = conditions(reconcile(body, cluster, CATALOG, IMAGE, clock()).status)
    assert {k: (v["status"], v["reason"]) for k, v in c.items()} == {
        "Ready": ("False", reason),
        "Fits": (fits, reason if fits == "Unknown" else "ModelDoesNotFit"),
        "Progressing": ("False", reason),
        "Degraded": ("Unknown", reason),
    }


# -- the kopf handlers ---------------------------------------------------------------------


def test_handlers_are_registered_for_pools_and_owned_deployments() -> None:
    registry = kopf.get_default_registry()
    ids = {h.id for h in registry._changing.get_all_handlers()} | {
        h.id for h in registry._spawning.get_all_handlers()} | {
        h.id for h in registry._watching.get_all_handlers()}  # fmt: skip
    for name in ("inferencepool_reconcile", "inferencepool_resync", "deployment_changed"):
        assert any(name in i for i in ids), (name, ids)


def test_settings_recover_stalled_watches_and_keep_progress_out_of_status() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    assert settings.watching.client_timeout and settings.watching.server_timeout
    assert settings.watching.client_timeout > settings.watching.server_timeout
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert not settings.scanning.disabled  # cluster-wide: namespaces and CRDs are observed


def test_routine_successes_are_debug_only_and_failures_always_show(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kopf says "succeeded" at INFO for each resync of each pool and each Deployment change."""
    handlers.configure(kopf.OperatorSettings())
    objects = logging.getLogger("kopf.objects")
    with caplog.at_level(logging.INFO):
        for line in sorted(handlers.ROUTINE_SUCCESSES):
            objects.info(line)
        objects.info("Handler 'inferencepool_reconcile' succeeded.")  # a spec change: shown
        objects.error("Timer 'inferencepool_resync' failed with an exception.")
    assert [r.getMessage() for r in caplog.records] == [
        "Handler 'inferencepool_reconcile' succeeded.",
        "Timer 'inferencepool_resync' failed with an exception.",
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        objects.info("Timer 'inferencepool_resync' succeeded.")
    assert len(caplog.records) == 1


def test_a_namespaced_operator_does_not_scan_what_it_may_not_list() -> None:
    """Watching named namespaces, the chart grants no cluster-wide list of namespaces."""
    settings = kopf.OperatorSettings()
    handlers.configure(settings, namespaced=True)
    assert settings.scanning.disabled


def test_a_deployment_event_reconciles_its_pool() -> None:
    """Someone deleted the Deployment: its pool's objects are applied again at once."""
    cluster = FakeCluster()
    body = pool()
    cluster.pools[("team-a", "frontier-premium")] = body
    memo = handlers.OperatorMemo(catalog=CATALOG, images=IMAGE, cluster=cluster)
    deployment = kopf.Body({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "frontier-premium", "namespace": "team-a", "ownerReferences": [
            {"apiVersion": "tiergate.dev/v1alpha1", "kind": "InferencePool",
             "name": "frontier-premium", "uid": "uid-1"}]}})  # fmt: skip
    handlers.deployment_changed(event={"type": "DELETED"}, body=deployment, memo=memo)
    assert [m["kind"] for m in cluster.applied] == ["Deployment", "Service"]
    assert cluster.status_patches[0][0] == "frontier-premium"
    cluster.pools.clear()  # the pool itself is gone: nothing is re-created
    handlers.deployment_changed(event={"type": "DELETED"}, body=deployment, memo=memo)
    assert len(cluster.applied) == 2


def test_rolled_out_with_no_replica_ready_is_degraded() -> None:
    cluster = FakeCluster()
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1}  # fmt: skip
    c = conditions(reconcile(pool(), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "NoReplicaReady")
    assert c["Progressing"]["status"] == "True" and c["Ready"]["status"] == "False"


def test_a_pool_scaled_to_zero_is_not_ready_and_settles_when_its_pods_are_gone() -> None:
    cluster = FakeCluster()
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 0}  # fmt: skip
    c = conditions(reconcile(pool(replicas=0), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ScaledToZero")
    assert (c["Progressing"]["status"], c["Degraded"]["status"]) == ("True", "False")
    cluster.deployments[("team-a", "frontier-premium")] = {}  # the last pod has gone
    c = conditions(reconcile(pool(replicas=0), cluster, CATALOG, IMAGE, clock()).status)
    assert c["Ready"]["reason"] == "ScaledToZero" and c["Progressing"]["reason"] == "Settled"


def test_a_rollout_whose_new_pod_never_gets_ready_is_not_settled() -> None:
    # The old pod still serves (ready 1) beside the new one that fails (updated 1, total 2).
    cluster = FakeCluster()
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 2, "readyReplicas": 1, "updatedReplicas": 1}  # fmt: skip
    c = conditions(reconcile(pool(), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RollingOut")
    assert "1 of the previous spec still running" in c["Progressing"]["message"]
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "ServingPreviousSpec")
    # Once the old pod is gone, the rollout is done.
    cluster.deployments[("team-a", "frontier-premium")]["replicas"] = 1
    c = conditions(reconcile(pool(), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "Settled")
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "Serving")


# -- rollouts, as `kubectl rollout status` reads them ---------------------------------------

DEPLOYMENT = ("team-a", "frontier-premium")
DEADLINE_EXCEEDED = {
    "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
    "message": 'ReplicaSet "frontier-premium-7d9" has timed out progressing.',
}  # fmt: skip


def _states(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {k: (v["status"], v["reason"]) for k, v in conditions(status).items() if k != "Fits"}


def test_a_finished_rollout_is_serving_settled_and_as_expected() -> None:
    cluster = FakeCluster()
    body = edit(served(cluster, pool()), {"batching": {"maxNumSeqs": 8}})
    cluster.deployments[DEPLOYMENT] = {
        "observedGeneration": 2, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
        ],
    }  # fmt: skip
    status = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert cluster.generations[DEPLOYMENT] == 2  # the edit changed the Deployment's spec
    assert _states(status) == {
        "Ready": ("True", "Serving"),
        "Progressing": ("False", "Settled"),
        "Degraded": ("False", "AsExpected"),
    }
    assert {c["observedGeneration"] for c in status["conditions"]} == {4}


def test_a_rollout_stuck_past_its_deadline_is_degraded_while_the_previous_spec_serves() -> None:
    """A 1-replica pool whose new pod crash-loops: maxUnavailable rounds to 0, so the old pod
    keeps serving beside it, and the Deployment gives up at its progress deadline."""
    cluster = FakeCluster()
    body = edit(served(cluster, pool()), {"batching": {"maxNumSeqs": 8}})
    cluster.deployments[DEPLOYMENT] = {
        "replicas": 2, "readyReplicas": 1, "updatedReplicas": 1,
        "conditions": [DEADLINE_EXCEEDED],
    }  # fmt: skip
    status = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert _states(status) == {
        "Ready": ("True", "ServingPreviousSpec"),
        "Progressing": ("False", "RolloutStuck"),
        "Degraded": ("True", "RolloutStuck"),
    }
    c = conditions(status)
    assert c["Ready"]["observedGeneration"] == 3  # the old pod's generation, not the new one
    assert c["Ready"]["message"].startswith("1/1 replicas ready, pods of the previous spec")
    assert (c["Progressing"]["observedGeneration"], c["Degraded"]["observedGeneration"]) == (4, 4)
    assert c["Degraded"]["message"] == (
        "the new spec's pods are not becoming ready: 1/1 replicas updated, 1 ready, "
        "1 of the previous spec still running"
    )
    assert "has timed out progressing" in c["Progressing"]["message"]
    # The resync finds it again: Ready stays about the generation that serves.
    body["status"] = status
    again = conditions(reconcile(body, cluster, CATALOG, IMAGE, clock()).status)
    assert (again["Ready"]["reason"], again["Ready"]["observedGeneration"]) == (
        "ServingPreviousSpec", 3)  # fmt: skip
    # Fixed by hand (the image pulled at last): the new pod is ready, the old one gone.
    cluster.deployments[DEPLOYMENT] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    done = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert _states(done) == {
        "Ready": ("True", "Serving"),
        "Progressing": ("False", "Settled"),
        "Degraded": ("False", "AsExpected"),
    }
    assert conditions(done)["Ready"]["observedGeneration"] == 4


def test_pods_starting_within_the_progress_deadline_are_not_degraded() -> None:
    """A cold start (a real engine loads weights for minutes): the Deployment's controller
    still counts it as progressing. Once it served, losing every ready pod is degraded at
    once: the controller keeps NewReplicaSetAvailable."""
    cluster = FakeCluster()
    reconcile(pool(), cluster, CATALOG, IMAGE, clock())
    progressing = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}
    cluster.deployments[DEPLOYMENT] = {
        "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1, "conditions": [progressing],
    }  # fmt: skip
    status = reconcile(pool(), cluster, CATALOG, IMAGE, clock()).status
    assert _states(status) == {
        "Ready": ("False", "ReplicasNotReady"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "Starting"),
    }
    served = {**progressing, "reason": "NewReplicaSetAvailable"}
    cluster.deployments[DEPLOYMENT]["conditions"] = [served]
    status = reconcile(pool(), cluster, CATALOG, IMAGE, clock()).status
    assert _states(status)["Degraded"] == ("True", "NoReplicaReady")


def test_pods_that_cannot_start_are_degraded_and_say_why() -> None:
    """Whatever the Deployment's controller thinks of its rollout: a pod no node takes (a GPU
    pool on a full fleet) or one whose image will not pull waits for someone to act."""
    cluster = FakeCluster()
    reconcile(pool(replicas=3), cluster, CATALOG, IMAGE, clock())
    progressing = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}
    cluster.deployments[DEPLOYMENT] = {
        "replicas": 3, "readyReplicas": 1, "updatedReplicas": 3, "conditions": [progressing],
    }  # fmt: skip
    cluster.pods[DEPLOYMENT] = [
        PodAddress("p-0", "10.0.0.1", True),
        PodAddress("p-2", None, False, "Unschedulable: 0/3 nodes are available: 3 Insufficient "
                   "nvidia.com/gpu."),
        PodAddress("p-1", "10.0.0.2", False, "ImagePullBackOff: " + "x" * 400),
        PodAddress("p-3", "10.0.0.3", False),  # on its way
    ]  # fmt: skip
    degraded = conditions(reconcile(pool(replicas=3), cluster, CATALOG, IMAGE, clock()).status)[
        "Degraded"
    ]
    assert (degraded["status"], degraded["reason"]) == ("True", "PodsCannotStart")
    message = degraded["message"]
    assert message.startswith("1/3 replicas ready; pod p-1 cannot start: ImagePullBackOff: xxx")
    assert message.endswith("... (and 1 more pod)") and len(message) < 400
    cluster.pods[DEPLOYMENT] = [PodAddress("p-0", "10.0.0.1", True)]
    degraded = conditions(reconcile(pool(replicas=3), cluster, CATALOG, IMAGE, clock()).status)[
        "Degraded"
    ]
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")


def test_pods_the_deployment_cannot_create_are_degraded_and_say_why() -> None:
    """A ResourceQuota (or a LimitRange, an admission webhook) refuses the pods: none exists to
    say why, and the Deployment's controller still calls a scale-up progressing. Its
    ReplicaFailure condition says why."""
    cluster = FakeCluster()
    reconcile(pool(replicas=3), cluster, CATALOG, IMAGE, clock())
    quota = (
        'pods "frontier-premium-7d9-x2k4p" is forbidden: exceeded quota: gpus, requested: '
        "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=16, limited: "
        "requests.nvidia.com/gpu=16"
    )
    cluster.deployments[DEPLOYMENT] = {
        "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
        "conditions": [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
             "message": quota},
        ],
    }  # fmt: skip
    cluster.pods[DEPLOYMENT] = [
        PodAddress("p-0", "10.0.0.1", True),
        PodAddress("p-1", "10.0.0.2", True),
    ]
    c = conditions(reconcile(pool(replicas=3), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "PodsCannotStart")
    assert c["Degraded"]["message"] == (
        f"2/3 replicas ready; the Deployment cannot create its pods: {quota}"
    )
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReplicasNotReady")
    # The quota raised: the third pod is created and serves; the condition is gone.
    cluster.deployments[DEPLOYMENT] = {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3}
    cluster.pods[DEPLOYMENT].append(PodAddress("p-2", "10.0.0.3", True))
    c = conditions(reconcile(pool(replicas=3), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("False", "AsExpected")


def test_a_stuck_rollout_with_no_pod_ready_says_nothing_serves() -> None:
    cluster = FakeCluster()
    reconcile(pool(), cluster, CATALOG, IMAGE, clock())
    cluster.deployments[DEPLOYMENT] = {
        "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1,
        "conditions": [DEADLINE_EXCEEDED],
    }  # fmt: skip
    status = reconcile(pool(), cluster, CATALOG, IMAGE, clock()).status
    assert _states(status) == {
        "Ready": ("False", "ReplicasNotReady"),
        "Progressing": ("False", "RolloutStuck"),
        "Degraded": ("True", "NoReplicaReady"),
    }


def test_a_deployment_whose_new_spec_is_not_observed_yet_is_still_rolling_out() -> None:
    """Right after the apply, the Deployment's status still counts the pods of its spec
    before: `kubectl wait --for=condition=Progressing=False` must not return yet."""
    cluster = FakeCluster()
    body = edit(served(cluster, pool()), {"batching": {"maxNumSeqs": 8}})
    # ... and a deadline its previous rollout exceeded is no word on the new one.
    cluster.deployments[DEPLOYMENT] = {
        "observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
        "conditions": [DEADLINE_EXCEEDED],
    }  # fmt: skip
    status = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert cluster.generations[DEPLOYMENT] == 2
    assert _states(status) == {
        "Ready": ("True", "ServingPreviousSpec"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "AsExpected"),
    }
    c = conditions(status)
    assert c["Ready"]["observedGeneration"] == 3
    assert c["Progressing"]["message"] == (
        "waiting for the Deployment's controller to observe its new spec; 1/1 replicas ready "
        "meanwhile"
    )
    del cluster.deployments[DEPLOYMENT]["observedGeneration"]  # observed, and done at once
    cluster.deployments[DEPLOYMENT]["conditions"] = []
    body["status"] = status
    done = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert _states(done)["Progressing"] == ("False", "Settled")
    assert conditions(done)["Ready"]["observedGeneration"] == 4


def test_the_resync_applies_the_pool_as_stored_not_the_body_kopf_had() -> None:
    """The timer's body may predate an edit whose handler runs beside it: what it applies
    is the stored pool's spec, never the older one."""
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(catalog=CATALOG, images=IMAGE, cluster=cluster)
    old = pool()
    cluster.pools[DEPLOYMENT] = edit(pool(), {"batching": {"maxNumSeqs": 8}})
    handlers.inferencepool_resync(body=kopf.Body(old), patch=kopf.Patch(), memo=memo)
    (deployment,) = [m for m in cluster.applied if m["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "8"
    assert deployment["metadata"]["annotations"][GENERATION_ANNOTATION] == "4"


def test_a_resync_that_read_the_pool_before_an_edit_applies_nothing_and_writes_nothing() -> None:
    """The resync reads the stored pool, and an edit's handler may apply the next generation
    before the resync applies: the Deployment keeps the newer spec, and the older status is not
    written over the newer one."""
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(catalog=CATALOG, images=IMAGE, cluster=cluster)
    newer = edit(pool(), {"batching": {"maxNumSeqs": 8}})
    handlers.inferencepool_reconcile(body=kopf.Body(newer), patch=kopf.Patch(), memo=memo)
    applied, patches = len(cluster.applied), len(cluster.status_patches)
    cluster.pools[DEPLOYMENT] = pool()  # what the resync read, generation 3: before the edit
    handlers.inferencepool_resync(body=kopf.Body(pool()), patch=kopf.Patch(), memo=memo)
    assert len(cluster.applied) == applied and len(cluster.status_patches) == patches
    live = cluster.existing[("Deployment", *DEPLOYMENT)]
    assert live["annotations"][GENERATION_ANNOTATION] == "4"
    # Not a newer generation: a pool deleted and created again (another uid) starts at 1,
    # and its Deployment, taken back from the old pool, is applied.
    again = pool()
    again["metadata"].update(uid="uid-2", generation=1)
    cluster.pools[DEPLOYMENT] = again
    handlers.inferencepool_resync(body=kopf.Body(again), patch=kopf.Patch(), memo=memo)
    assert len(cluster.applied) > applied
    assert (
        cluster.existing[("Deployment", *DEPLOYMENT)]["annotations"][GENERATION_ANNOTATION] == "1"
    )


def test_a_bad_spec_is_permanent_on_change_and_silent_on_resync() -> None:
    events: list[str] = []
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(
        catalog=CATALOG,
        images=IMAGE,
        cluster=cluster,
        warn=lambda body, reason, message: events.append(reason),
    )
    body = kopf.Body(pool(model="gpt-17"))
    with pytest.raises(kopf.PermanentError, match="gpt-17"):
        handlers.inferencepool_reconcile(body=body, patch=kopf.Patch(), memo=memo)
    assert events == ["InvalidSpec"]
    handlers.inferencepool_resync(body=body, patch=kopf.Patch(), memo=memo)  # no raise, no event
    assert events == ["InvalidSpec"]
    ready = conditions(cluster.status_patches[-1][1])["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")


def test_a_name_taken_is_an_event_from_the_resync_too_but_only_once() -> None:
    """Another app's Service may appear after the pool was created: the timer finds it."""
    events: list[str] = []
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(
        catalog=CATALOG,
        images=IMAGE,
        cluster=cluster,
        warn=lambda body, reason, message: events.append(reason),
    )
    _foreign(cluster, "Service")
    body = pool()
    handlers.inferencepool_resync(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
    assert events == ["NameTaken"]
    body["status"] = dict(cluster.status_patches[-1][1])
    handlers.inferencepool_resync(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
    assert events == ["NameTaken"]
    with pytest.raises(kopf.PermanentError, match="already exists"):  # a spec edit: no retries
        handlers.inferencepool_reconcile(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
    assert events == ["NameTaken"]


# -- inline profiles -----------------------------------------------------------------------


def test_a_pool_with_an_inline_model_runs_it_and_says_where_it_came_from() -> None:
    cluster = FakeCluster()
    outcome = reconcile(pool("custom-model"), cluster, CATALOG, IMAGE, clock())
    deployment = cluster.applied[0]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    pool_json = json.loads(env["TIERGATE_POOL_JSON"])
    assert pool_json["modelProfile"]["name"] == pool_json["model"] == "team-72b-instruct"
    envelope = outcome.status["envelope"]
    assert (envelope["modelSource"], envelope["acceleratorSource"]) == ("inline", "catalog")
    assert envelope["tokensPerSecondPerStream"] > 0
    fits = conditions(outcome.status)["Fits"]
    assert fits["status"] == "True"
    assert fits["message"] == "team-72b-instruct (inline profile) fits 4 x h100-sxm"
    assert "team-72b-instruct" not in CATALOG.models


def test_an_inline_profile_shadowing_the_catalog_is_reported_as_such() -> None:
    published = reconcile(pool(), FakeCluster(), CATALOG, IMAGE, clock()).status["envelope"]
    halved = CATALOG.model("frontier").model_copy(update={"total_params_b": 80,
                                                          "active_params_b": 80})  # fmt: skip
    body = pool(modelProfile=halved.model_dump(by_alias=True, exclude_none=True))
    outcome = reconcile(body, FakeCluster(), CATALOG, IMAGE, clock())
    envelope = outcome.status["envelope"]
    assert envelope["modelSource"] == "inline-shadows-catalog"
    assert envelope["tokensPerSecondPerStream"] > published["tokensPerSecondPerStream"]
    fits = conditions(outcome.status)["Fits"]["message"]
    assert fits.startswith("frontier (inline profile, shadowing the catalog entry) fits 8 x b200")
    assert CATALOG.model("frontier").total_params_b == 160


def test_an_inline_model_too_big_for_its_chips_names_the_profile_in_the_misfit() -> None:
    huge = CATALOG.model("llama-3.1-405b").model_copy(update={"name": "huge"})
    body = pool(model="huge", modelProfile=huge.model_dump(by_alias=True), chips=1,
                tensorParallel=1)  # fmt: skip
    fits = conditions(reconcile(body, FakeCluster(), CATALOG, IMAGE, clock()).status)["Fits"]
    assert fits["reason"] == "ModelDoesNotFit"
    assert fits["message"].startswith("does not fit: huge (inline profile) on 1 x b200")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"name": "someone-else"}, "modelProfile.name 'someone-else' must equal model"),
        ({"heads": 60}, "heads must be a multiple of kv_heads"),
        ({"layers": None}, "modelProfile.layers: Field required"),
        ({"vocabSize": 10**15}, "modelProfile.vocabSize: Input should be less than or equal"),
    ],
)  # fmt: skip
def test_a_bad_inline_profile_is_an_invalid_spec(changes: dict[str, Any], words: str) -> None:
    profile = CATALOG.model("frontier").model_dump(by_alias=True, exclude_none=True)
    for key, value in changes.items():
        if value is None:
            profile.pop(key)
        else:
            profile[key] = value
    cluster = FakeCluster()
    outcome = reconcile(pool(modelProfile=profile), cluster, CATALOG, IMAGE, clock())
    assert cluster.applied == []
    assert outcome.permanent_error is not None and words in outcome.permanent_error
