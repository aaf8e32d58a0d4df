"""Behind a Gateway API gateway, on a real API server: the chart installs the Gateway API
Inference Extension's InferencePool CRD (v1.6.0), and the operator keeps one GIE
InferencePool beside the pools, selecting their pods, naming the routers' endpoint picker
(which answers gRPC health behind its Service),
owned by every pool with pods: a pool's deletion drops its reference, the last one's deletes
it. Both kinds named InferencePool answer clearly by their group and short names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cluster import REPO, LocalCluster
from grpc_health.v1 import health_pb2, health_pb2_grpc
from picker_channel import channel
from release import Release, installed, namespace_for

EXAMPLES = REPO / "examples"
GIE = "inferencepools.inference.networking.k8s.io"
GATEWAY_POOL = "tiergate"
#: The gateway's pods: they send requests straight to the pods the picker chose.
GATEWAY_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}


@pytest.fixture(scope="module")
def release(cluster: LocalCluster) -> Iterator[Release]:
    values = ("--set", "gatewayPool.enabled=true", "--set", "router.eppPort=9002",
              "--set-json", f"gatewayPool.gatewayFrom=[{json.dumps(GATEWAY_PEER)}]")  # fmt: skip
    with installed(cluster, namespace_for("gateway-pool"), *values) as r:
        yield r


def test_the_gateways_pods_may_reach_the_pools_pods(release: Release) -> None:
    policy = release.get("networkpolicy", f"{release.name}-sim-nodes")
    (ingress,) = policy["spec"]["ingress"]
    assert GATEWAY_PEER in ingress["from"]


def _pool_name(example: str) -> str:
    doc = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text(encoding="utf-8"))
    return str(doc["metadata"]["name"])


def _gateway_pool(release: Release) -> dict[str, Any] | None:
    if not release.exists(GIE, GATEWAY_POOL):
        return None
    return release.get(GIE, GATEWAY_POOL)


def _owners(release: Release) -> list[str]:
    obj = _gateway_pool(release) or {}
    return sorted(ref["name"] for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def test_the_gateway_pool_follows_the_pools_and_goes_with_the_last(release: Release) -> None:
    batched, premium = _pool_name("batched"), _pool_name("premium")
    release.kubectl("apply", "-f", str(EXAMPLES / "batched.yaml"))
    release.wait(lambda: _owners(release) == [batched], "the GIE InferencePool owned by batched")
    gateway = _gateway_pool(release)
    assert gateway is not None
    spec = gateway["spec"]
    assert spec["selector"] == {"matchLabels": {"app.kubernetes.io/name": "tiergate-sim-node"}}
    assert spec["targetPorts"] == [{"number": 8000}]
    assert spec["endpointPickerRef"] == {
        "group": "", "kind": "Service", "name": f"{release.name}-router-epp",
        "port": {"number": 9002}, "failureMode": "FailClose",
    }  # fmt: skip
    _the_picker_answers_behind_its_service(release)
    # The gateway's pool selects the pods the router routes to.
    selector = "app.kubernetes.io/name=tiergate-sim-node"
    release.wait(
        lambda: bool(release.kubectl("get", "pods", "-l", selector, "-o", "name").strip()),
        "a pod selected by the GIE InferencePool",
    )

    release.kubectl("apply", "-f", str(EXAMPLES / "premium.yaml"))
    release.wait(
        lambda: _owners(release) == sorted([batched, premium]), "both pools owning the GIE pool"
    )
    release.kubectl("delete", "inferencepool.tiergate.dev", batched, "--wait=true")
    release.wait(lambda: _owners(release) == [premium], "batched's reference dropped")
    release.kubectl("delete", "inferencepool.tiergate.dev", premium, "--wait=true")
    release.wait(lambda: _gateway_pool(release) is None, "the GIE InferencePool deleted")


def _the_picker_answers_behind_its_service(release: Release) -> None:
    """The picker Service targets the router pods' `epp` port, and the gRPC health service
    there says the picker is serving. (Pods here have loopback addresses, which EndpointSlices
    refuse: the Service's port is followed to the pod by hand, as kube-proxy would.)"""
    service = release.get("service", f"{release.name}-router-epp")
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"], port["appProtocol"]) == (9002, "epp", "http2")
    router = release.get("deployment", f"{release.name}-router")["spec"]["template"]["spec"]
    (container,) = router["containers"]
    (epp,) = [p for p in container["ports"] if p["name"] == "epp"]
    router_ip = release.router_url().removeprefix("http://").rsplit(":", 1)[0]
    # Over TLS, the chart's default, trusting the certificate served (as gateways do).
    with channel(router_ip, epp["containerPort"]) as picker:
        stub = health_pb2_grpc.HealthStub(picker)
        reply = stub.Check(health_pb2.HealthCheckRequest(service="inference-extension"), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_both_inferencepool_kinds_answer_by_group_and_short_name(release: Release) -> None:
    name = _pool_name("wafer-scale")
    release.kubectl("apply", "-f", str(EXAMPLES / "wafer-scale.yaml"))
    release.wait(lambda: _gateway_pool(release) is not None, "the GIE InferencePool")
    ours = release.kubectl("get", "ipool", "-o", "name")
    gies = release.kubectl("get", "infpool", "-o", "name")
    assert ours.split() == [f"inferencepool.tiergate.dev/{name}"]
    assert gies.split() == [f"inferencepool.inference.networking.k8s.io/{GATEWAY_POOL}"]
    assert release.kubectl("get", GIE, "-o", "name").split() == gies.split()
    assert (
        release.kubectl("get", "inferencepools.tiergate.dev", "-o", "name").split() == ours.split()
    )
    assert release.kubectl("get", "tiergate", "-o", "name").split() == ours.split()  # category
    # The bare plural is ambiguous: kubectl takes the group that sorts first, GIE's. The docs
    # say `ipool` or `inferencepools.tiergate.dev` wherever GIE may be installed.
    assert release.kubectl("get", "inferencepools", "-o", "name").split() == gies.split()
    release.kubectl("delete", "inferencepool.tiergate.dev", name, "--wait=true")


def test_the_example_route_is_an_httproute_the_api_server_takes(release: Release) -> None:
    """examples/gateway/httproute.yaml against the Gateway API's own HTTPRoute CRD (its
    schema and CEL rules, on the real API server): it sends /v1/ to the GIE pool."""
    (crd,) = (release.cluster.bin.parent / "crds").glob("gateway.networking.k8s.io_httproutes-*")
    release.cluster.kubectl("apply", "--server-side", "-f", str(crd))
    release.wait(
        lambda: "True" in release.cluster.kubectl(
            "get", "crd", "httproutes.gateway.networking.k8s.io",
            "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False,
        ),
        "the HTTPRoute CRD established",
    )  # fmt: skip
    release.kubectl("apply", "-f", str(EXAMPLES / "gateway" / "httproute.yaml"))
    route = release.get("httproute.gateway.networking.k8s.io", "tiergate")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", GATEWAY_POOL,
    )  # fmt: skip
