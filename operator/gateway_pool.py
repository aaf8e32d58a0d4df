"""The Gateway API Inference Extension (GIE) InferencePool that puts tiergate behind a gateway.

A gateway routes an HTTPRoute's traffic to a GIE `InferencePool`
(`inference.networking.k8s.io/v1`) and asks the pool's endpoint picker which pod takes each
request. tiergate's router is that picker, and it decides the tier as well as the pod (the
`x-tiergate-tier` header, `service_tier`, the tenant's default, spill-over to another tier).
So the operator makes one GIE pool for all the serving pods the routers route to, every tier
and every model of the routers' namespace, rather than one per tier: a GIE pool bounds where
the gateway may send a request, and a pool per tier would make the gateway, not tiergate,
choose the tier. Hosted pools have no pods and are not in it (they serve through the router's
own port only).

The GIE pool is owned by every tiergate pool it serves (owner references, none of them the
controller), so Kubernetes deletes it with the last of them and drops a deleted one's
reference from it. The gateway writes its status; the operator never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tiergate.pools import NAME_LABEL, SIM_NODE_NAME

from .engine_args import CONTAINER_PORT
from .render import FIELD_MANAGER

__all__ = [
    "GATEWAY_GROUP",
    "GATEWAY_VERSION",
    "GatewayApi",
    "GatewayPool",
    "GatewayPoolMissing",
    "gateway_pool_manifest",
    "sync_gateway_pool",
]

Manifest = dict[str, Any]

GATEWAY_GROUP = "inference.networking.k8s.io"
GATEWAY_VERSION = "v1"
FailureMode = Literal["FailOpen", "FailClose"]


class GatewayPoolMissing(Exception):
    """The API server has no `inferencepools.inference.networking.k8s.io` (GIE's CRD is not
    installed)."""


class GatewayApi(Protocol):
    def list_pools(self, namespace: str) -> list[Manifest]: ...

    def apply_gateway_pool(self, manifest: Manifest) -> None: ...

    def delete_gateway_pool(self, namespace: str, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class GatewayPool:
    """Where the GIE pool goes and the endpoint picker it names (the operator's flags)."""

    namespace: str  # the routers' discovery namespace: the pods, and the picker's Service
    name: str
    epp_service: str
    epp_port: int
    failure_mode: FailureMode = "FailClose"


def _serves_pods(pool: Manifest) -> bool:
    spec = pool.get("spec") or {}
    meta = pool.get("metadata") or {}
    return spec.get("endpoint") is None and not meta.get("deletionTimestamp")


def _owner(pool: Manifest) -> Manifest:
    meta = pool["metadata"]
    return {
        "apiVersion": pool["apiVersion"],
        "kind": pool["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,  # deleting a pool never waits on the gateway's object
    }


def gateway_pool_manifest(gateway: GatewayPool, owners: list[Manifest]) -> Manifest:
    """The GIE InferencePool selecting every sim-node or engine pod (the router's own
    selector), on the serving port, with the router's endpoint picker."""
    return {
        "apiVersion": f"{GATEWAY_GROUP}/{GATEWAY_VERSION}",
        "kind": "InferencePool",
        "metadata": {
            "name": gateway.name,
            "namespace": gateway.namespace,
            "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
            "ownerReferences": [_owner(pool) for pool in owners],
        },
        "spec": {
            "selector": {"matchLabels": {NAME_LABEL: SIM_NODE_NAME}},
            "targetPorts": [{"number": CONTAINER_PORT}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "kind": "Service",
                "name": gateway.epp_service,
                "port": {"number": gateway.epp_port},
                "failureMode": gateway.failure_mode,
            },
        },
    }


def sync_gateway_pool(gateway: GatewayPool, api: GatewayApi) -> frozenset[str]:
    """Apply the GIE pool for the tiergate pools of its namespace that have pods, or delete it
    when none has; the uids of its owners (none: deleted). Raises GatewayPoolMissing when
    GIE's CRD is not installed."""
    owners = sorted(
        (pool for pool in api.list_pools(gateway.namespace) if _serves_pods(pool)),
        key=lambda pool: str(pool["metadata"]["name"]),
    )
    if not owners:
        api.delete_gateway_pool(gateway.namespace, gateway.name)
        return frozenset()
    api.apply_gateway_pool(gateway_pool_manifest(gateway, owners))
    return frozenset(str(pool["metadata"]["uid"]) for pool in owners)
