"""The endpoint picker in the chart: `router.eppPort` turns it on, and the router's
configuration, its container port (`epp`, which the picker's Service targets) and its
NetworkPolicy follow; off by default.

The picker's TLS is server-only: it cannot tell the gateway from any other caller, and a caller
that reports failures for an endpoint gets it ejected. So under NetworkPolicies its port admits
the gateway's pods (gatewayPool.gatewayFrom) only, with or without gatewayPool.enabled, and the
chart refuses the port with no peers named rather than open it to all.
"""

from __future__ import annotations

import json

import pytest
import yaml
from chart_helpers import (
    GATEWAY_FROM,
    GATEWAY_PEER,
    ROUTER,
    Helm,
    HelmFailed,
    ingress_by_port,
    one,
)

#: The picker, for a gateway configured by hand (no gatewayPool), and its pods named.
PICKER = ["router.eppPort=9002", GATEWAY_FROM]


def test_the_picker_is_off_by_default(helm: Helm) -> None:
    manifests = helm.template()
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    assert "eppPort" not in config["router"]
    (container,) = one(manifests, "Deployment", ROUTER)["spec"]["template"]["spec"]["containers"]
    assert "epp" not in [p["name"] for p in container["ports"]]


def test_every_part_follows_the_epp_port_value(helm: Helm) -> None:
    manifests = helm.template(sets=PICKER)
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    assert config["router"]["eppPort"] == 9002
    pod = one(manifests, "Deployment", ROUTER)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert {"name": "epp", "containerPort": 9002, "protocol": "TCP"} in container["ports"]
    assert "epp" in ingress_by_port(manifests)


@pytest.mark.parametrize(
    "sets",
    [PICKER, [*PICKER, "gatewayPool.enabled=true"]],
    ids=["gateway-by-hand", "gateway-pool"],
)
def test_only_the_gateway_s_pods_reach_the_picker(helm: Helm, sets: list[str]) -> None:
    by_port = ingress_by_port(helm.template(sets=sets))
    assert by_port["epp"] == [GATEWAY_PEER]
    assert by_port["http"] == [{}]  # the tenants' port stays open to every client


def test_the_picker_with_no_peers_named_is_refused_under_network_policies(helm: Helm) -> None:
    with pytest.raises(HelmFailed, match="router.eppPort with networkPolicy.enabled needs "
                       "gatewayPool.gatewayFrom"):  # fmt: skip
        helm.template(sets=["router.eppPort=9002"])


def test_without_network_policies_the_picker_needs_no_peers(helm: Helm) -> None:
    manifests = helm.template(sets=["router.eppPort=9002", "networkPolicy.enabled=false"])
    assert not [m for m in manifests if m["kind"] == "NetworkPolicy"]


def test_peers_that_match_every_source_open_the_picker_as_asked(helm: Helm) -> None:
    """Opening the port to all is allowed, but only said in so many words."""
    everyone = [{"namespaceSelector": {}}, {"ipBlock": {"cidr": "0.0.0.0/0"}}]
    manifests = helm.template(
        sets=["router.eppPort=9002"], set_jsons=[f"gatewayPool.gatewayFrom={json.dumps(everyone)}"]
    )
    assert ingress_by_port(manifests)["epp"] == everyone


@pytest.mark.parametrize("port", ["8080", "8090"])
def test_the_picker_needs_a_port_of_its_own(helm: Helm, port: str) -> None:
    with pytest.raises(HelmFailed, match="router.eppPort: the endpoint picker needs a port"):
        helm.template(sets=[f"router.eppPort={port}", GATEWAY_FROM])


def _picker(manifests: list[dict]) -> tuple[dict, list[dict]]:
    """The router's eppTls setting and its config volume's sources."""
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    pod = one(manifests, "Deployment", ROUTER)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    return config["router"]["eppTls"], volume["projected"]["sources"]


def test_the_picker_serves_tls_with_a_certificate_of_its_own_by_default(helm: Helm) -> None:
    tls, sources = _picker(helm.template(sets=PICKER))
    assert tls == {"enabled": True}
    assert not [s for s in sources if "epp-tls" in str(s)]


def test_a_tls_secret_is_projected_and_named_to_the_router(helm: Helm) -> None:
    sets = [*PICKER, "router.eppTls.existingSecret=picker-cert"]
    tls, sources = _picker(helm.template(sets=sets))
    assert tls == {
        "enabled": True,
        "certFile": "/etc/tiergate/epp-tls/tls.crt",
        "keyFile": "/etc/tiergate/epp-tls/tls.key",
    }
    (secret,) = [s["secret"] for s in sources if s.get("secret", {}).get("name") == "picker-cert"]
    assert secret["items"] == [
        {"key": "tls.crt", "path": "epp-tls/tls.crt"},
        {"key": "tls.key", "path": "epp-tls/tls.key"},
    ]


def test_a_plaintext_picker_takes_no_secret(helm: Helm) -> None:
    sets = [*PICKER, "router.eppTls.enabled=false", "router.eppTls.existingSecret=picker-cert"]
    tls, sources = _picker(helm.template(sets=sets))
    assert tls == {"enabled": False}
    assert not [s for s in sources if "picker-cert" in str(s)]


def test_a_tls_value_of_the_wrong_kind_is_refused_by_the_schema(helm: Helm) -> None:
    with pytest.raises(HelmFailed, match="eppTls"):
        helm.template(sets=[*PICKER, "router.eppTls.enabled=maybe"])
