"""The chart behind a Gateway API gateway: GIE's CRD (as vendored, kept on uninstall), the
routers' endpoint picker Service, the operator's flags and permissions for the GIE pool, and
clear refusals of values that cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chart_helpers import (
    CHART,
    GATEWAY_FROM,
    NAMESPACE,
    OPERATOR,
    ROUTER,
    Helm,
    HelmFailed,
    Manifest,
    find,
    one,
)

from tiergate.cli import build_parser
from tiergate.operator.commands.operator_cmd import gateway_pool
from tiergate.operator.gateway_pool import GatewayPool

GIE_CRD = "inferencepools.inference.networking.k8s.io"
VENDORED = (
    CHART
    / "files"
    / "gateway-api-inference-extension"
    / ("inference.networking.k8s.io_inferencepools.yaml")
)


def _operator_args(manifests: list[Manifest]) -> list[str]:
    deployment = one(manifests, "Deployment", OPERATOR)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [str(arg) for arg in container["args"]]


def test_the_crd_is_gie_s_own_and_outlives_the_release(gateway_manifests: list[Manifest]) -> None:
    crd = one(gateway_manifests, "CustomResourceDefinition", GIE_CRD)
    vendored = yaml.safe_load(Path(VENDORED).read_text(encoding="utf-8"))
    assert crd["spec"] == vendored["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == "v1.6.0"


def test_the_picker_service_selects_the_routers_on_their_epp_port(
    gateway_manifests: list[Manifest],
) -> None:
    service = one(gateway_manifests, "Service", f"{ROUTER}-epp")
    router = one(gateway_manifests, "Service", ROUTER)
    assert service["spec"]["selector"] == router["spec"]["selector"]
    assert service["spec"]["ports"] == [
        {"name": "grpc", "port": 9002, "targetPort": "epp", "protocol": "TCP",
         "appProtocol": "http2"},
    ]  # fmt: skip


def test_the_operator_keeps_the_gateway_pool_the_values_name(
    gateway_manifests: list[Manifest],
) -> None:
    args = build_parser("operator").parse_args(_operator_args(gateway_manifests))
    assert gateway_pool(args, lambda: "unused") == GatewayPool(
        NAMESPACE, "tiergate", f"{ROUTER}-epp", 9002, "FailClose"
    )


def test_the_operator_may_write_gie_pools_only_when_asked(
    gateway_manifests: list[Manifest], default_manifests: list[Manifest]
) -> None:
    def rules(manifests: list[Manifest]) -> list[Manifest]:
        return [
            rule
            for role in find(manifests, "Role", OPERATOR)
            for rule in role["rules"]
            if "inference.networking.k8s.io" in rule["apiGroups"]
        ]

    assert [sorted(r["verbs"]) for r in rules(gateway_manifests)] == [["create", "delete", "patch"]]
    assert rules(default_manifests) == []
    assert "--gateway-pool" not in _operator_args(default_manifests)
    assert find(default_manifests, "CustomResourceDefinition") == []
    assert find(default_manifests, "Service", f"{ROUTER}-epp") == []


def test_a_cluster_with_gie_s_crd_already_gets_none_from_the_chart(helm: Helm) -> None:
    manifests = helm.template(
        sets=[
            "gatewayPool.enabled=true",
            "router.eppPort=9002",
            "gatewayPool.installCRD=false",
            GATEWAY_FROM,
        ]
    )
    assert find(manifests, "CustomResourceDefinition") == []
    assert find(manifests, "Service", f"{ROUTER}-epp")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["gatewayPool.enabled=true", GATEWAY_FROM], "gatewayPool.enabled needs router.eppPort"),
        (
            ["gatewayPool.enabled=true", "router.eppPort=9002", "router.discoveryNamespace=x",
             GATEWAY_FROM],
            "gatewayPool.enabled needs router.discoveryNamespace empty or the release namespace",
        ),
        (["gatewayPool.enabled=true", "router.eppPort=9002", "gatewayPool.failureMode=Open",
          GATEWAY_FROM], "failureMode"),
        # The gateway asks the picker, and sends requests to the pools' pods itself: both
        # policies must let it in, and it alone into the picker.
        (["gatewayPool.enabled=true", "router.eppPort=9002"],
         "gatewayPool.enabled with networkPolicy.enabled needs gatewayPool.gatewayFrom"),
        (["gatewayPool.enabled=true", "router.eppPort=9002", "gatewayPool.gatewayFrom[0].pods=x"],
         "/gatewayPool/gatewayFrom/0"),
    ],
)  # fmt: skip
def test_values_that_cannot_work_are_refused_with_the_reason(
    helm: Helm, sets: list[str], message: str
) -> None:
    with pytest.raises(HelmFailed, match=message):
        helm.template(sets=sets)
