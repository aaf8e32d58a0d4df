"""The router's metrics port in the chart: one value (`router.metricsPort`) that the router's
configuration, its container port, its pods' scrape annotations and the metrics Service all
follow; and a NetworkPolicy on the router's pods that leaves the tenants' port open to every
client and lets only the operator's pods (its autoscaler reads the routers' queues) and
`networkPolicy.metricsFrom` reach the metrics port.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_helpers import OPERATOR, ROUTER, Helm, HelmFailed, Manifest, ingress_by_port, one

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
METRICS_FROM = "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels"


def router_pod(manifests: list[Manifest]) -> dict[str, Any]:
    return dict(one(manifests, "Deployment", ROUTER)["spec"]["template"])


def test_every_part_follows_the_metrics_port_value(helm: Helm) -> None:
    manifests = helm.template(sets=["router.metricsPort=9105"])
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    assert config["router"]["metricsPort"] == 9105
    pod = router_pod(manifests)
    (container,) = pod["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9105, "protocol": "TCP"} in container["ports"]
    annotations = pod["metadata"]["annotations"]
    assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/port"]) == (
        "true",
        "9105",
    )
    assert annotations["prometheus.io/path"] == "/metrics"
    service = one(manifests, "Service", ROUTER + "-metrics")["spec"]
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(9105, "metrics")]


def test_the_metrics_port_cannot_be_the_tenants_port(helm: Helm) -> None:
    with pytest.raises(HelmFailed, match="router.metricsPort: 8080 is the router's own port"):
        helm.template(sets=["router.metricsPort=8080"])


def operator_peer(manifests: list[Manifest]) -> dict[str, Any]:
    """A `from` peer selecting the operator's pods (the release namespace) as their
    Deployment selects them."""
    return {"podSelector": one(manifests, "Deployment", OPERATOR)["spec"]["selector"]}


def test_the_tenants_port_is_open_and_the_metrics_port_only_to_the_operator_by_default(
    default_manifests: list[Manifest],
) -> None:
    policy = one(default_manifests, "NetworkPolicy", ROUTER)["spec"]
    pod_labels = router_pod(default_manifests)["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    assert ingress_by_port(default_manifests) == {
        "http": [{}],
        "metrics": [operator_peer(default_manifests)],  # its autoscaler reads the queues
    }


def test_metrics_from_lets_only_those_sources_reach_the_metrics_port(helm: Helm) -> None:
    manifests = helm.template(sets=[f"{METRICS_FROM}.kubernetes\\.io/metadata\\.name=monitoring"])
    assert ingress_by_port(manifests) == {
        "http": [{}],
        "metrics": [operator_peer(manifests), MONITORING],
    }


def test_no_router_policy_when_network_policies_are_off(helm: Helm) -> None:
    manifests = helm.template(sets=["networkPolicy.enabled=false"])
    assert not [m for m in manifests if m["kind"] == "NetworkPolicy"]
