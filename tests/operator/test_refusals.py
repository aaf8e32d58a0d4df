"""Specs the operator refuses: images outside its allow-list, and edits it will not roll out
while pods of the previous spec still serve (the status must say both)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, conditions, edit, pool, served

from tiergate.cli import build_parser
from tiergate.operator import handlers
from tiergate.operator.commands.operator_cmd import image_policy
from tiergate.operator.images import ImagePolicy
from tiergate.operator.reconcile import reconcile
from tiergate.operator.render import GENERATION_ANNOTATION
from tiergate.router.config import ConfigError
from tiergate.router.discovery.kube_state import pool_from_object
from tiergate.router.discovery.view import build_pool

NOT_ALLOWED = {"template": {"image": "docker.io/someone/miner:latest"}}
# The node would refuse to start: no batch slot left beside 4 background sequences.
BACKGROUND_TOO_BIG = {
    "batching": {"maxNumSeqs": 4},
    "background": {"sequences": 4, "contextTokens": 1000},
}
UNKNOWN_MODEL = {"model": "gpt-17"}
DOES_NOT_FIT = {"chips": 1, "tensorParallel": 1}


# -- the image allow-list -----------------------------------------------------------------


def test_an_image_not_allowed_gets_a_condition_one_event_and_no_deployment() -> None:
    events: list[tuple[str, str]] = []
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(
        catalog=CATALOG,
        images=IMAGE,
        cluster=cluster,
        warn=lambda body, reason, message: events.append((reason, message)),
    )
    body = pool(**NOT_ALLOWED)
    with pytest.raises(kopf.PermanentError, match="not allowed"):
        handlers.inferencepool_reconcile(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
    assert cluster.applied == []
    c = conditions(cluster.status_patches[-1][1])
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ImageNotAllowed")
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "ImageNotAllowed")
    assert c["Fits"]["status"] == "True"  # the model fits: the image is what is refused
    assert c["Ready"]["message"] == (
        "spec.template.image docker.io/someone/miner:latest is not allowed: this operator runs "
        "tiergate:0.1.0, vllm/vllm-openai:v0.32.0, lmsysorg/sglang:v0.5.3-cu126 (its "
        "allow-list: `tiergate operator --allowed-image`, chart value operator.allowedImages)"
    )
    assert events == [("ImageNotAllowed", c["Ready"]["message"])]
    body["status"] = dict(cluster.status_patches[-1][1])
    for _ in range(2):  # the resync timer and Deployment events: no more events, no objects
        handlers.inferencepool_resync(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
    assert len(events) == 1 and cluster.applied == []


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("tiergate:0.1.0", frozenset()),  # the operator's own, named explicitly
        ("mirror.example.com/tiergate:0.1.0", frozenset({"mirror.example.com/tiergate:0.1.0"})),
    ],
)
def test_the_operator_s_own_image_and_the_allow_list_run(
    image: str, allowed: frozenset[str]
) -> None:
    cluster = FakeCluster()
    images = ImagePolicy("tiergate:0.1.0", allowed)
    outcome = reconcile(pool(template={"image": image}), cluster, CATALOG, images, clock())
    assert outcome.permanent_error is None
    deployment = cluster.applied[0]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image


@pytest.mark.parametrize(
    "image",
    [
        "mirror.example.com/tiergate:0.1.0-evil",  # an allowed reference is not a prefix
        "mirror.example.com/tiergate",  # nor is its repository without the tag
        "tiergate:0.1.1",
    ],
)
def test_allowed_images_are_whole_references(image: str) -> None:
    images = ImagePolicy("tiergate:0.1.0", frozenset({"mirror.example.com/tiergate:0.1.0"}))
    outcome = reconcile(pool(template={"image": image}), FakeCluster(), CATALOG, images, clock())
    assert conditions(outcome.status)["Ready"]["reason"] == "ImageNotAllowed"
    assert "mirror.example.com/tiergate:0.1.0 (its allow-list" in outcome.status["conditions"][0][
        "message"]  # fmt: skip


def test_the_allow_list_comes_from_the_operator_s_flags() -> None:
    args = build_parser("operator").parse_args(
        ["operator", "--image", "tiergate:1", "--allowed-image", "a:1", "--allowed-image", "b@x"]
    )
    assert image_policy(args) == ImagePolicy("tiergate:1", frozenset({"a:1", "b@x"}))
    plain = build_parser("operator").parse_args(["operator", "--image", "tiergate:1"])
    assert image_policy(plain) == ImagePolicy("tiergate:1")


# -- a refused edit while the previous spec serves ----------------------------------------


def test_deployments_record_the_generation_they_were_applied_from() -> None:
    cluster = FakeCluster()
    reconcile(pool(), cluster, CATALOG, IMAGE, clock())
    deployment, service = cluster.applied
    assert deployment["metadata"]["annotations"] == {GENERATION_ANNOTATION: "3"}
    # On the Deployment only: a new generation alone must not roll the pods.
    assert GENERATION_ANNOTATION not in deployment["spec"]["template"]["metadata"]["annotations"]
    assert "annotations" not in service["metadata"]


@pytest.mark.parametrize(
    ("changes", "reason", "words"),
    [
        (BACKGROUND_TOO_BIG, "InvalidSpec", "4 resident sequences leave no batch slot"),
        (NOT_ALLOWED, "ImageNotAllowed", "miner:latest is not allowed"),
    ],
)
def test_a_refused_edit_says_the_previous_spec_still_serves(
    changes: dict[str, Any], reason: str, words: str
) -> None:
    """The router keeps routing to the pods of the previous spec: Ready says they serve (about
    the generation they run), Progressing that the new one is refused and why."""
    cluster = FakeCluster()
    body = served(cluster, pool())
    applied = len(cluster.applied)
    outcome = reconcile(edit(body, changes), cluster, CATALOG, IMAGE, clock())
    assert len(cluster.applied) == applied  # nothing changed in the cluster
    status = outcome.status
    assert status["observedGeneration"] == 4
    c = conditions(status)
    ready, progressing = c["Ready"], c["Progressing"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "True", "ServingPreviousSpec", 3)  # fmt: skip
    assert ready["message"] == (
        f"1/1 replicas of the previous spec ready; the current spec is not rolled out "
        f"({reason}): see Progressing"
    )
    assert (progressing["status"], progressing["reason"]) == ("False", reason)
    assert progressing["observedGeneration"] == 4
    assert progressing["message"].startswith("not rolled out: ") and words in progressing[
        "message"] and progressing["message"].endswith("; what ran before runs on")  # fmt: skip
    assert (c["Fits"]["status"], c["Degraded"]["status"]) == ("True", "False")
    assert (status["replicas"], status["readyReplicas"]) == (1, 1)
    assert [r for r, _ in outcome.warnings] == [reason] and outcome.permanent_error is not None
    # Ready did not flap: its transition time is the one from when the pods became ready.
    before = conditions(body["status"])["Ready"]["lastTransitionTime"]
    assert ready["lastTransitionTime"] == before

    body["status"] = status  # mended: the next generation rolls out and Ready is about it
    edit(body, {"template": None, "background": None, "batching": {"maxNumSeqs": 4}})
    mended = conditions(reconcile(body, cluster, CATALOG, IMAGE, clock()).status)
    assert mended["Ready"]["observedGeneration"] == 5
    assert cluster.applied[-2]["metadata"]["annotations"] == {GENERATION_ANNOTATION: "5"}


def test_a_refused_edit_with_no_pod_ready_is_not_ready() -> None:
    cluster = FakeCluster()
    body = served(cluster, pool())
    cluster.deployments[("team-a", "frontier-premium")] = {
        "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1}  # fmt: skip
    c = conditions(reconcile(edit(body, NOT_ALLOWED), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ImageNotAllowed")
    assert c["Ready"]["observedGeneration"] == 4


def test_another_apps_deployment_is_not_taken_for_the_previous_spec() -> None:
    cluster = FakeCluster()
    meta = {"name": "frontier-premium", "namespace": "team-a", "labels": {"app": "billing"}}
    cluster.existing[("Deployment", "team-a", "frontier-premium")] = meta
    cluster.deployments[("team-a", "frontier-premium")] = {"replicas": 3, "readyReplicas": 3}
    c = conditions(reconcile(pool(**NOT_ALLOWED), cluster, CATALOG, IMAGE, clock()).status)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ImageNotAllowed")


@pytest.mark.parametrize(
    ("changes", "routed"),
    [
        (BACKGROUND_TOO_BIG, True),
        (NOT_ALLOWED, True),
        (UNKNOWN_MODEL, False),
        (DOES_NOT_FIT, False),
    ],
)
def test_ready_says_what_the_router_does_with_the_previous_pods(
    changes: dict[str, Any], routed: bool
) -> None:
    """The operator's Ready after a refused edit agrees with the router, which reads the pool's
    spec and its pods: it routes to the previous spec's pods when it can evaluate the new spec,
    and drops the pool (Ready=False) when it cannot."""
    cluster = FakeCluster()
    body = edit(served(cluster, pool()), changes)
    ready = conditions(reconcile(body, cluster, CATALOG, IMAGE, clock()).status)["Ready"]
    try:
        build_pool(pool_from_object(body), CATALOG, ["http://10.0.0.1:8000"])
        router_routes = True
    except ConfigError:
        router_routes = False
    assert router_routes is routed
    assert (ready["status"] == "True") is routed
