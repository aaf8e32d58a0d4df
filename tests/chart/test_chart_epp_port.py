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
