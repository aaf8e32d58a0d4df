"""The pure half of Kubernetes discovery: API objects and watch events folded into pools.

Objects are the JSON dicts the API server sends (camelCase, as `kubectl get -o json` shows
them), so recorded list and watch responses replay through exactly this code. Nothing here
does I/O or knows about threads: `kube_watch` feeds it, `kube` publishes what it holds.

A pool's endpoints are its pods, watched directly, the way the Gateway API Inference
Extension's endpoint picker watches the pods its InferencePool selects; not the pool
Service's EndpointSlices. Two reasons: the router wants each pod's own readiness and
identity, not the Service's view of them; and the API server refuses loopback addresses in
EndpointSlices (ValidateEndpointIP: "may not be in the loopback range"), while the local
end-to-end backend (kwok) gives pods IPs in 127.0.0.0/8.

The operator's contract (`tiergate.pools.sim_node_pods`): every sim-node pod of the
InferencePool P is labelled `app.kubernetes.io/name=tiergate-sim-node` and
`tiergate.dev/pool=P`, its container has a port named `http`, and its annotation
`tiergate.dev/serves` lists the model names it answers to (those of the spec it was made from,
which during a rollout may not be the pool's spec).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tiergate.common.addresses import url_host
from tiergate.common.validation import first_problem
from tiergate.pools import HTTP_PORT_NAME, POOL_LABEL, SIM_NODE_SELECTOR, served_names
from tiergate.router.config import ConfigError, PoolSpec

log = logging.getLogger("tiergate.router.kube")

Object = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Resource:
    """A namespaced resource the router lists and watches."""

    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    label_selector: str = ""  # lists and watches only the objects it matches; "" for all


INFERENCE_POOLS = Resource("InferencePool", "tiergate.dev", "v1alpha1", "inferencepools")
#: Sim-node pods of every pool (the pool is each pod's own label).
PODS = Resource("Pod", "", "v1", "pods", SIM_NODE_SELECTOR)
RESOURCES = (INFERENCE_POOLS, PODS)


class KubeApiError(Exception):
    """A list or watch failed (HTTP error, transport error, garbage); worth retrying."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WatchExpired(Exception):
    """410 Gone: the resourceVersion is too old to watch from; list again."""


# Names PoolSpec accepts at the top level, by field name and by camelCase alias. Anything
# else in an InferencePool's spec (slo, template, ...) is the operator's business.
_POOL_KEYS = frozenset(
    {name for name in PoolSpec.model_fields}
    | {f.alias for f in PoolSpec.model_fields.values() if f.alias is not None}
)


def pool_from_object(obj: Object, endpoints: Sequence[str] = ()) -> PoolSpec:
    """The router's PoolSpec of one InferencePool object; ConfigError says what is wrong.

    The one place an InferencePool is read, so it can later switch to the operator's API
    models. Top-level spec keys the router does not know are dropped, not rejected: the CRD
    carries more than the router needs.
    """
    metadata = obj.get("metadata") or {}
    name = metadata.get("name", "?")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"pool {name}: spec: not an object")
    dropped = sorted(k for k in spec if k not in _POOL_KEYS)
    if dropped:
        log.debug("event=pool_keys_ignored pool=%s keys=%s", name, ",".join(map(str, dropped)))
    known = {k: v for k, v in spec.items() if k in _POOL_KEYS}
    try:
        return PoolSpec.model_validate({**known, "name": name, "endpoints": list(endpoints)})
    except ValidationError as exc:
        raise ConfigError(f"pool {name}: {first_problem(exc)}") from None


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """What the view takes from a pod that can take requests: its pool, its URL, the model
    names it answers to (None: it does not say, so every name of its pool), and which pod it
    is (its `metadata.uid`: a new pod may be given an old one's IP)."""

    pool: str
    url: str
    serves: frozenset[str] | None = None
    uid: str | None = None


def pod_endpoint(obj: Object) -> PodEndpoint | None:
    """The pool (label `tiergate.dev/pool`) and URL of a pod that can take requests, else None.

    It can when it is Running, its Ready condition is "True", it is not being deleted (no
    `deletionTimestamp`: a terminating pod may still report Ready for a while) and it has an
    IP. A pod without a container port named `http` never can (not a sim node as the
    operator renders them).
    """
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    pool = (metadata.get("labels") or {}).get(POOL_LABEL)
    if not isinstance(pool, str) or not pool or metadata.get("deletionTimestamp"):
        return None
    if status.get("phase") != "Running" or not _ready(status):
        return None
    host, port = url_host(status.get("podIP")), _http_port(obj.get("spec") or {})
    if host is None or port is None:
        return None
    uid = metadata.get("uid")
    return PodEndpoint(
        pool,
        f"http://{host}:{port}",
        served_names(metadata.get("annotations") or {}),
        uid if isinstance(uid, str) and uid else None,
    )


def _ready(status: Object) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _http_port(spec: Object) -> int | None:
    """The number of the first container port named `http`."""
    ports = (
        port
        for container in spec.get("containers") or ()
        if isinstance(container, Mapping)
        for port in container.get("ports") or ()
        if isinstance(port, Mapping) and port.get("name") == HTTP_PORT_NAME
    )
    number = next(ports, {}).get("containerPort")
    return number if isinstance(number, int) and 0 < number < 65536 else None


def list_items(body: Object) -> tuple[list[Object], str]:
    """A list response's items and resourceVersion (to watch from)."""
    items = body.get("items")
    version = (body.get("metadata") or {}).get("resourceVersion")
    if not isinstance(items, list) or not isinstance(version, str) or not version:
        raise KubeApiError("list response without items or metadata.resourceVersion")
    return [i for i in items if isinstance(i, Mapping)], version


def event_resource_version(event: Object) -> str | None:
    """The resourceVersion a watch event moves to; raises on an ERROR event.

    ERROR with code 410 (the version has been compacted away) raises WatchExpired: the
    caller must list again. Any other ERROR raises KubeApiError.
    """
    obj = event.get("object")
    if not isinstance(obj, Mapping):
        raise KubeApiError(f"watch event {event.get('type')!r} without an object")
    if event.get("type") == "ERROR":
        code = obj.get("code")
        if code == 410:
            raise WatchExpired(str(obj.get("message", "resource version expired")))
        raise KubeApiError(
            f"watch error {obj.get('reason')}: {obj.get('message')}",
            code if isinstance(code, int) else None,
        )
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return version if isinstance(version, str) and version else None


def _name(obj: Object) -> str | None:
    name = (obj.get("metadata") or {}).get("name")
    return name if isinstance(name, str) and name else None


@dataclass(slots=True)
class ClusterState:
    """InferencePools and serving sim-node pods of one namespace, as the watches last told.

    `revision` counts changes that matter to the view, so the publisher can tell whether a
    rebuild is due: pods get many status updates (probes, restarts, conditions), and only
    one that changes a pod's pool or URL, or whether it serves at all, is a change.
    """

    pools: dict[str, Object] = field(default_factory=dict)
    pods: dict[str, PodEndpoint] = field(default_factory=dict)  # serving pods, by pod name
    listed: set[str] = field(default_factory=set)  # kinds listed at least once
    revision: int = 0

    def replace(self, resource: Resource, items: Iterable[Object]) -> None:
        """A (re-)list: everything of this kind is what the list says, nothing else."""
        if resource == INFERENCE_POOLS:
            self.pools = {n: o for o in items if (n := _name(o)) is not None}
        else:
            self.pods = {
                n: e for o in items if (n := _name(o)) is not None and (e := pod_endpoint(o))
            }
        self.listed.add(resource.kind)
        self.revision += 1

    def apply(self, resource: Resource, event: Object) -> bool:
        """Fold one watch event in; True if something the view depends on changed."""
        kind, obj = event.get("type"), event.get("object")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, Mapping):
            return False  # BOOKMARK (only moves the resourceVersion), or noise
        name = _name(obj)
        if name is None:
            return False
        if resource == INFERENCE_POOLS:
            if kind == "DELETED":
                changed = self.pools.pop(name, None) is not None
            else:
                # Only the spec shapes the view: status writes by the operator are no reason
                # to rebuild it.
                before = self.pools.get(name)
                changed = before is None or before.get("spec") != obj.get("spec")
                self.pools[name] = obj
        else:
            endpoint = None if kind == "DELETED" else pod_endpoint(obj)
            before_endpoint = self.pods.pop(name, None)
            if endpoint is not None:
                self.pods[name] = endpoint
            changed = before_endpoint != endpoint
        if changed:
            self.revision += 1
        return changed

    @property
    def synced(self) -> bool:
        """Both kinds listed at least once: the view can be trusted as complete."""
        return all(r.kind in self.listed for r in RESOURCES)

    def endpoints_of(self, pool: str) -> list[PodEndpoint]:
        """`pool`'s serving pods (pod name order, the first of any two with one URL)."""
        found: dict[str, PodEndpoint] = {}
        for name in sorted(self.pods):
            pod = self.pods[name]
            if pod.pool == pool:
                found.setdefault(pod.url, pod)
        return list(found.values())
