"""The endpoint picker in the chart: `router.eppPort` turns it on, and the router's
configuration, its container port (`epp`, which the picker's Service targets) and its
NetworkPolicy follow; off by default."""

from __future__ import annotations

import pytest
import yaml
from chart_helpers import ROUTER, Helm, HelmFailed, one


def test_the_picker_is_off_by_default(helm: Helm) -> None:
    manifests = helm.template()
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    assert "eppPort" not in config["router"]
    (container,) = one(manifests, "Deployment", ROUTER)["spec"]["template"]["spec"]["containers"]
    assert "epp" not in [p["name"] for p in container["ports"]]


def test_every_part_follows_the_epp_port_value(helm: Helm) -> None:
    manifests = helm.template(sets=["router.eppPort=9002"])
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    assert config["router"]["eppPort"] == 9002
    pod = one(manifests, "Deployment", ROUTER)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert {"name": "epp", "containerPort": 9002, "protocol": "TCP"} in container["ports"]
    open_ports = [
        p["port"]
        for rule in one(manifests, "NetworkPolicy", ROUTER)["spec"]["ingress"]
        if not rule.get("from")
        for p in rule["ports"]
    ]
    assert "epp" in open_ports  # the gateway asks from its own namespace


@pytest.mark.parametrize("port", ["8080", "8090"])
def test_the_picker_needs_a_port_of_its_own(helm: Helm, port: str) -> None:
    with pytest.raises(HelmFailed, match="eppPort"):
        helm.template(sets=[f"router.eppPort={port}"])


def _picker(manifests: list[dict]) -> tuple[dict, list[dict]]:
    """The router's eppTls setting and its config volume's sources."""
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    pod = one(manifests, "Deployment", ROUTER)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    return config["router"]["eppTls"], volume["projected"]["sources"]


def test_the_picker_serves_tls_with_a_certificate_of_its_own_by_default(helm: Helm) -> None:
    tls, sources = _picker(helm.template(sets=["router.eppPort=9002"]))
    assert tls == {"enabled": True}
    assert not [s for s in sources if "epp-tls" in str(s)]


def test_a_tls_secret_is_projected_and_named_to_the_router(helm: Helm) -> None:
    sets = ["router.eppPort=9002", "router.eppTls.existingSecret=picker-cert"]
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
    sets = ["router.eppPort=9002", "router.eppTls.enabled=false",
            "router.eppTls.existingSecret=picker-cert"]  # fmt: skip
    tls, sources = _picker(helm.template(sets=sets))
    assert tls == {"enabled": False}
    assert not [s for s in sources if "picker-cert" in str(s)]


def test_a_tls_value_of_the_wrong_kind_is_refused_by_the_schema(helm: Helm) -> None:
    with pytest.raises(HelmFailed, match="eppTls"):
        helm.template(sets=["router.eppPort=9002", "router.eppTls.enabled=maybe"])
