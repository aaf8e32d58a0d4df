"""The chart lints, renders with default and variant values, and renders what each option asks."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml
from chart_helpers import (
    CHART,
    NAMESPACE,
    OPERATOR,
    RELEASE,
    ROUTER,
    VARIANT,
    Helm,
    Manifest,
    find,
    one,
)

LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)

# The InferencePool CRD is generated into crds/ by `tiergate crds` (the operator's schema),
# not written here. This stand-in has the contract's names, to see the chart with it present.
POOL_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferencepools.tiergate.dev"},
    "spec": {
        "group": "tiergate.dev",
        "scope": "Namespaced",
        "names": {"kind": "InferencePool", "plural": "inferencepools", "singular": "inferencepool"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object"}},
                "subresources": {"status": {}},
            }
        ],
    },
}


@pytest.fixture(scope="module")
def chart_with_pool_crd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart whose crds/ also holds an InferencePool CRD (as after generation)."""
    chart = tmp_path_factory.mktemp("chart") / "tiergate"
    shutil.copytree(CHART, chart)
    target = chart / "crds" / "inferencepools.tiergate.dev.yaml"
    if not target.exists():
        target.write_text(yaml.safe_dump(POOL_CRD))
    return chart


@pytest.mark.parametrize("values", [[], [VARIANT]], ids=["default", "variant"])
def test_helm_lint_strict_passes(helm: Helm, values: list[Path]) -> None:
    args = [a for path in values for a in ("--values", str(path))]
    out = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *args)
    assert "0 chart(s) failed" in out


def test_lint_and_crds_with_the_generated_pool_crd_present(
    helm: Helm, chart_with_pool_crd: Path
) -> None:
    helm.run("lint", "--strict", str(chart_with_pool_crd))
    crds = find(
        helm.template(chart=chart_with_pool_crd, include_crds=True), "CustomResourceDefinition"
    )
    names = {crd["metadata"]["name"] for crd in crds}
    assert names == {
        "inferencepools.tiergate.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }


def test_kopf_peering_crds_are_cluster_and_namespaced(helm: Helm) -> None:
    crds = find(helm.template(include_crds=True), "CustomResourceDefinition")
    by_name = {crd["metadata"]["name"]: crd["spec"] for crd in crds}
    assert by_name["clusterkopfpeerings.kopf.dev"]["scope"] == "Cluster"
    assert by_name["kopfpeerings.kopf.dev"]["scope"] == "Namespaced"
    for name in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        spec = by_name[name]
        assert spec["group"] == "kopf.dev" and [v["name"] for v in spec["versions"]] == ["v1"]
        status = spec["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


def kinds(manifests: list[Manifest]) -> Counter[str]:
    return Counter(m["kind"] for m in manifests)


def test_default_render_is_the_minimal_install(default_manifests: list[Manifest]) -> None:
    assert kinds(default_manifests) == {
        "ServiceAccount": 2,
        "ConfigMap": 1,
        # The router's, the operator's, and the operator's to list the router's pods (whose
        # queues its autoscaler reads), all in the release namespace.
        "Role": 3,
        "RoleBinding": 3,
        "Service": 2,  # the router's, and its metrics port's
        "Deployment": 2,
        "Pod": 1,  # the helm test hook
        "KopfPeering": 1,  # operator replicas elect one writer through it
        # Only the router reaches the sim nodes; only the operator the router's metrics port.
        "NetworkPolicy": 2,
    }
    assert one(default_manifests, "Deployment", ROUTER)["spec"]["replicas"] == 1
    assert one(default_manifests, "Deployment", OPERATOR)["spec"]["replicas"] == 1


def test_the_operator_s_peering_object_matches_what_it_watches(helm: Helm) -> None:
    """`tiergate operator` peers under the name "tiergate": cluster-wide when it watches every
    namespace, else one KopfPeering in each watched namespace."""
    manifests = helm.template(sets=["operator.watchNamespaces={a,b}"])
    peerings = [m for m in manifests if m["kind"].endswith("KopfPeering")]
    assert {(m["kind"], m["metadata"]["name"], m["metadata"].get("namespace"))
            for m in peerings} == {("KopfPeering", "tiergate", "a"),
                                   ("KopfPeering", "tiergate", "b")}  # fmt: skip
    everywhere = helm.template(sets=["operator.clusterWide=true"])
    cluster_peerings = [(m["kind"], m["metadata"]["name"]) for m in everywhere
                        if m["kind"].endswith("KopfPeering")]  # fmt: skip
    assert cluster_peerings == [("ClusterKopfPeering", "tiergate")]


def test_variant_render_adds_every_optional_part(variant_manifests: list[Manifest]) -> None:
    counts = kinds(variant_manifests)
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor", "Secret"):
        assert counts[kind] == 1, kind
    # The HPA owns the router's replica count.
    assert "replicas" not in one(variant_manifests, "Deployment", ROUTER)["spec"]
    hpa = one(variant_manifests, "HorizontalPodAutoscaler", ROUTER)["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 6)
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": ROUTER}
    pdb = one(variant_manifests, "PodDisruptionBudget", ROUTER)["spec"]
    assert pdb["maxUnavailable"] == "25%"
    assert pdb["selector"]["matchLabels"]["app.kubernetes.io/component"] == "router"


def test_service_monitor_scrapes_the_router_metrics_port(variant_manifests: list[Manifest]) -> None:
    """The metrics Service's port, never the tenants' Service."""
    monitor = one(variant_manifests, "ServiceMonitor", ROUTER)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"].items()
    metrics = one(variant_manifests, "Service", ROUTER + "-metrics")
    assert selector <= metrics["metadata"]["labels"].items()
    assert not selector <= one(variant_manifests, "Service", ROUTER)["metadata"]["labels"].items()
    endpoint = monitor["spec"]["endpoints"][0]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == (
        "metrics",
        "/metrics",
        "15s",
    )
    assert [p["name"] for p in metrics["spec"]["ports"]] == ["metrics"]


def test_every_object_carries_the_standard_labels(any_manifests: list[Manifest]) -> None:
    for manifest in any_manifests:
        labels = manifest["metadata"]["labels"]
        assert all(labels.get(key) for key in LABELS), manifest["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "tiergate-0.1.0"


def test_pods_carry_the_labels_their_selectors_match(any_manifests: list[Manifest]) -> None:
    for deployment in find(any_manifests, "Deployment"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert "app.kubernetes.io/version" not in selector  # would break upgrades
