"""The sim nodes' NetworkPolicy: only the router's pods reach them, on the port they serve
requests and metrics on, in every namespace where the operator renders them; behind a gateway
(router.eppPort, with or without gatewayPool.enabled), the gateway's pods too (it sends each
request to the pod the picker chose).

The policy's selectors are checked against the labels the pods really carry: the router's from
its Deployment's pod template, the sim nodes' from the operator's own rendering
(operator/render.py), so neither side can drift from the other unnoticed. Whether the policy is
enforced is the network plugin's business: the local e2e backend runs pods as processes and
enforces nothing, hence these render tests.
"""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import (
    GATEWAY_FROM,
    GATEWAY_NAMESPACE,
    GATEWAY_PEER,
    NAMESPACE,
    RELEASE,
    ROUTER,
    Helm,
    Manifest,
    find,
    one,
)

from tiergate.operator.render import CONTAINER_PORT, deployment_manifest
from tiergate.operator.status import assess
from tiergate.pools import HTTP_PORT_NAME, InferencePool
from tiergate.sim_nodes.catalogs import default_catalog

POLICY = f"{RELEASE}-tiergate-sim-nodes"


def sim_node_pod(namespace: str) -> dict[str, Any]:
    """The pod template the operator renders for a pool (the premium example), with the
    labels a pool's own template adds."""
    pool = InferencePool.model_validate({
        "metadata": {"name": "frontier-premium"},
        "spec": {"tier": "premium", "model": "frontier", "accelerator": "b200", "chips": 8,
                 "tensorParallel": 8, "batching": {"maxNumSeqs": 4},
                 "template": {"labels": {"team": "a"}}},
    })  # fmt: skip
    layout = assess(pool.spec, default_catalog()).layout
    assert layout is not None
    deployment = deployment_manifest("frontier-premium", namespace, pool.spec, "t:1", layout)
    return dict(deployment["spec"]["template"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def policies(manifests: list[Manifest]) -> dict[str, Manifest]:
    return {p["metadata"]["namespace"]: p for p in find(manifests, "NetworkPolicy", POLICY)}


def test_only_the_router_s_and_operator_s_pods_reach_the_sim_nodes(
    default_manifests: list[Manifest],
) -> None:
    (policy,) = policies(default_manifests).values()
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert spec["policyTypes"] == ["Ingress"]
    pod = sim_node_pod(NAMESPACE)
    assert selects(spec["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    (rule,) = spec["ingress"]
    peer, operator_peer = rule["from"]
    router_pod = one(default_manifests, "Deployment", ROUTER)["spec"]["template"]
    assert selects(peer["podSelector"]["matchLabels"], router_pod["metadata"]["labels"])
    # The autoscaler scrapes each pod's metrics.
    operator = one(default_manifests, "Deployment", f"{RELEASE}-tiergate-operator")
    operator_labels = operator["spec"]["template"]["metadata"]["labels"]
    assert selects(operator_peer["podSelector"]["matchLabels"], operator_labels)
    # The release's namespace, by the label Kubernetes puts on every namespace.
    release = {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert peer["namespaceSelector"] == operator_peer["namespaceSelector"] == release
    # The one port the node serves, requests and the metrics the router scrapes alike.
    (container,) = pod["spec"]["containers"]
    assert container["ports"] == [
        {"name": HTTP_PORT_NAME, "containerPort": CONTAINER_PORT, "protocol": "TCP"}
    ]
    assert rule["ports"] == [{"port": HTTP_PORT_NAME, "protocol": "TCP"}]


def test_the_policy_selects_no_pod_of_the_chart(default_manifests: list[Manifest]) -> None:
    """The router, the operator and the helm test pod are not sim nodes: left alone."""
    selector = one(default_manifests, "NetworkPolicy", POLICY)["spec"]["podSelector"]
    for m in default_manifests:
        if m["kind"] in ("Deployment", "Pod"):
            labels = (m["spec"]["template"] if m["kind"] == "Deployment" else m)["metadata"]
            assert not selects(selector["matchLabels"], labels["labels"]), m["metadata"]["name"]


def test_the_router_s_selector_does_not_match_the_other_pods(
    default_manifests: list[Manifest],
) -> None:
    peer, operator_peer = one(default_manifests, "NetworkPolicy", POLICY)["spec"]["ingress"][0][
        "from"
    ]
    operator = one(default_manifests, "Deployment", f"{RELEASE}-tiergate-operator")
    router = one(default_manifests, "Deployment", ROUTER)
    test_pod = one(default_manifests, "Pod", f"{RELEASE}-tiergate-test-request")
    others = (test_pod["metadata"]["labels"], sim_node_pod(NAMESPACE)["metadata"]["labels"])
    for labels in (operator["spec"]["template"]["metadata"]["labels"], *others):
        assert not selects(peer["podSelector"]["matchLabels"], labels)  # fmt: skip
    for labels in (router["spec"]["template"]["metadata"]["labels"], *others):
        assert not selects(operator_peer["podSelector"]["matchLabels"], labels)  # fmt: skip


@pytest.mark.parametrize(
    ("sets", "namespaces"),
    [
        ([], [NAMESPACE]),
        (["operator.watchNamespaces={team-a,team-b}"], ["team-a", "team-b"]),
        (["operator.clusterWide=true", "router.discoveryNamespace=pools"], ["pools"]),
        (["networkPolicy.enabled=false"], []),
    ],
)
def test_a_policy_in_each_namespace_the_operator_renders_sim_nodes_in(
    helm: Helm, sets: list[str], namespaces: list[str]
) -> None:
    found = policies(helm.template(sets=sets))
    assert sorted(found) == namespaces
    for policy in found.values():  # the router lives in the release namespace, wherever they are
        peer = policy["spec"]["ingress"][0]["from"][0]
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": NAMESPACE
        }


def test_extra_sources_are_added_beside_the_router(helm: Helm) -> None:
    monitoring = "networkPolicy.extraFrom[0].namespaceSelector.matchLabels"
    manifests = helm.template(sets=[f"{monitoring}.kubernetes\\.io/metadata\\.name=monitoring"])
    peers = one(manifests, "NetworkPolicy", POLICY)["spec"]["ingress"][0]["from"]
    assert len(peers) == 3  # the router, the operator, the extra
    assert peers[2] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }


def test_behind_a_gateway_its_pods_reach_the_pools_it_routes_to(helm: Helm) -> None:
    """The gateway's pool selects the pods of the release namespace (the chart refuses another
    discovery namespace with it): that namespace's policy lets the gateway in, on the same
    port; the sim nodes of the other watched namespaces stay the router's alone."""
    sets = ["gatewayPool.enabled=true", "router.eppPort=9002", GATEWAY_FROM,
            f"operator.watchNamespaces={{{NAMESPACE},team-b}}"]  # fmt: skip
    found = policies(helm.template(sets=sets))
    gateway = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": GATEWAY_NAMESPACE}}
    }
    (rule,) = found[NAMESPACE]["spec"]["ingress"]
    assert rule["from"][2:] == [gateway]
    assert rule["ports"] == [{"port": HTTP_PORT_NAME, "protocol": "TCP"}]
    (other,) = found["team-b"]["spec"]["ingress"]
    assert len(other["from"]) == 2  # the router, the operator


def test_a_gateway_configured_by_hand_reaches_the_pods_the_picker_picks(helm: Helm) -> None:
    """Without gatewayPool the picker still picks the discovery namespace's pods, and the
    gateway's pods still send requests straight to them."""
    sets = ["router.eppPort=9002", GATEWAY_FROM, f"operator.watchNamespaces={{{NAMESPACE},pools}}",
            "router.discoveryNamespace=pools"]  # fmt: skip
    found = policies(helm.template(sets=sets))
    assert found["pools"]["spec"]["ingress"][0]["from"][2:] == [GATEWAY_PEER]
    assert len(found[NAMESPACE]["spec"]["ingress"][0]["from"]) == 2  # the router, the operator


def test_a_gateway_needs_no_peers_where_no_policy_is_rendered(helm: Helm) -> None:
    manifests = helm.template(
        sets=["gatewayPool.enabled=true", "router.eppPort=9002", "networkPolicy.enabled=false"]
    )
    assert find(manifests, "NetworkPolicy") == []
