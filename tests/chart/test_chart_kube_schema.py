"""Every rendered manifest validates against the Kubernetes 1.33 OpenAPI schemas (strict).

kubernetes-validate bundles the schemas of Kubernetes' own kinds only. ServiceMonitor,
PodMonitor and PrometheusRule (the Prometheus Operator's CRDs) and the kopf peering objects
have none there, so they are the kinds not validated; the test asserts that only those were
left out, so nothing else slips through. tests/chart/test_chart_monitoring.py checks the
monitoring kinds' fields, and test_chart_monitoring_proof.py loads the rules into Prometheus.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
from chart_helpers import GATEWAY_FROM, VARIANT, Helm, Manifest

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

KUBERNETES = "1.33"
# The Prometheus Operator's kinds; the kopf peering kinds: their CRDs ship in crds/.
MONITORING = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
NOT_IN_THE_BUNDLED_SCHEMAS = MONITORING | {"ClusterKopfPeering", "KopfPeering"}


def validate_all(manifests: list[Manifest]) -> set[str]:
    """Validate each manifest; return the kinds that have no bundled schema."""
    unschemaed = set()
    for manifest in manifests:
        where = f"{manifest['kind']}/{manifest['metadata']['name']}"
        try:
            kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unschemaed.add(manifest["kind"])
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{where} is invalid for Kubernetes {KUBERNETES} at {path}: {exc.message}")
    return unschemaed


@pytest.mark.parametrize(
    ("values", "sets", "set_strings"),
    [
        ([], [], []),
        ([VARIANT], [], []),
        ([], ["router.ledger.persistence.enabled=true", "router.replicas=1"], []),
        (
            [],
            [
                "router.ledger.postgres.existingSecret=tiergate-dsn",
                "router.ledger.postgres.passwordSecret.name=tiergate-db",
                "router.replicas=3",
                "router.workers=4",
            ],
            [],
        ),
        ([], ["operator.watchNamespaces={a,b,c}", "router.discoveryNamespace=pools"], []),
        ([], ["operator.clusterWide=true", "operator.allowedImages={a/b:1}"], []),
        (
            [],
            ["networkPolicy.extraFrom[0].namespaceSelector.matchLabels.team=monitoring"],
            [],
        ),
        # Names YAML would read as numbers must still render as strings.
        ([], [], ["operator.watchNamespaces={123,4e5}", "router.discoveryNamespace=0"]),
        ([], ["gatewayPool.enabled=true", "router.eppPort=9002", GATEWAY_FROM], []),
    ],
    ids=[
        "default",
        "variant",
        "persistent-ledger",
        "postgres-ledger-dsn-secret",
        "namespaced-operator",
        "cluster-wide-operator",
        "network-policy-extra-from",
        "numeric-namespaces",
        "gateway",
    ],
)
def test_rendered_manifests_are_valid_kubernetes_1_33(
    helm: Helm, values: list[Path], sets: list[str], set_strings: list[str]
) -> None:
    manifests = helm.template(values=values, sets=sets, set_strings=set_strings, include_crds=True)
    assert manifests
    unschemaed = validate_all(manifests)
    assert unschemaed <= NOT_IN_THE_BUNDLED_SCHEMAS


def test_the_validator_catches_a_bad_manifest(default_manifests: list[Manifest]) -> None:
    """The check above can fail: a misspelt field in a pod template is refused."""
    deployment = next(m for m in default_manifests if m["kind"] == "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_only_the_known_kinds_are_left_unvalidated(helm: Helm) -> None:
    # The variant watches listed namespaces: namespaced peering objects, no cluster-wide one.
    assert validate_all(helm.template(values=[VARIANT])) == MONITORING | {"KopfPeering"}
