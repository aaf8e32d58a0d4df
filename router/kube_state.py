"""The pure half of Kubernetes discovery: API objects and watch events folded into pools.

Objects are the JSON dicts the API server sends (camelCase, as `kubectl get -o json` shows
them), so recorded list and watch responses replay through exactly this code. Nothing here
does I/O or knows about threads: `kube_watch` feeds it, `kube_discovery` publishes what it
holds.

The operator's contract: an InferencePool named P gets a Service named P with a port named
`http`, so P's EndpointSlices carry the label `kubernetes.io/service-name=P`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tiergate.sim_nodes.validation import first_problem

from .config import ConfigError, PoolSpec

log = logging.getLogger("tiergate.router.kube")

Object = Mapping[str, Any]

#: The label EndpointSlices carry naming their Service (so: their InferencePool).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: The Service port whose number endpoint URLs use.
HTTP_PORT_NAME = "http"


@dataclass(frozen=True, slots=True)
class Resource:
    """A namespaced resource the router lists and watches."""

    kind: str
    group: str  # "" for the core group
    version: str
    plural: str


INFERENCE_POOLS = Resource("InferencePool", "tiergate.dev", "v1alpha1", "inferencepools")
ENDPOINT_SLICES = Resource("EndpointSlice", "discovery.k8s.io", "v1", "endpointslices")
RESOURCES = (INFERENCE_POOLS, ENDPOINT_SLICES)


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


def slice_urls(obj: Object) -> tuple[str, ...]:
    """`http://<address>:<http port>` of every endpoint of a slice not known to be unready.

    `conditions.ready` absent means ready (the API's own rule); a slice without a port named
    `http` yields nothing (not the operator's Service, or not yet complete).
    """
    ports = [
        p.get("port")
        for p in obj.get("ports") or ()
        if isinstance(p, Mapping) and p.get("name") == HTTP_PORT_NAME
    ]
    if not ports or not isinstance(ports[0], int):
        return ()
    port = ports[0]
    ipv6 = obj.get("addressType") == "IPv6"
    urls: list[str] = []
    for endpoint in obj.get("endpoints") or ():
        if not isinstance(endpoint, Mapping):
            continue
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False:
            continue
        for address in endpoint.get("addresses") or ():
            host = f"[{address}]" if ipv6 else address
            urls.append(f"http://{host}:{port}")
    return tuple(urls)


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
class _Slice:
    service: str | None
    urls: tuple[str, ...]


@dataclass(slots=True)
class ClusterState:
    """InferencePools and EndpointSlices of one namespace, as the watches last told.

    `revision` counts changes, so the publisher can tell whether a rebuild is due.
    """

    pools: dict[str, Object] = field(default_factory=dict)
    slices: dict[str, _Slice] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)  # kinds listed at least once
    revision: int = 0

    def replace(self, resource: Resource, items: Iterable[Object]) -> None:
        """A (re-)list: everything of this kind is what the list says, nothing else."""
        if resource == INFERENCE_POOLS:
            self.pools = {n: o for o in items if (n := _name(o)) is not None}
        else:
            self.slices = {n: _parse_slice(o) for o in items if (n := _name(o)) is not None}
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
        elif kind == "DELETED":
            changed = self.slices.pop(name, None) is not None
        else:
            parsed = _parse_slice(obj)
            changed = self.slices.get(name) != parsed
            self.slices[name] = parsed
        if changed:
            self.revision += 1
        return changed

    @property
    def synced(self) -> bool:
        """Both kinds listed at least once: the view can be trusted as complete."""
        return all(r.kind in self.listed for r in RESOURCES)

    def urls_of(self, pool: str) -> list[str]:
        """Endpoint URLs of `pool` over all its slices (slice name order, no duplicates)."""
        urls = (u for n in sorted(self.slices) if self.slices[n].service == pool
                for u in self.slices[n].urls)  # fmt: skip
        return list(dict.fromkeys(urls))


def _parse_slice(obj: Object) -> _Slice:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL)
    return _Slice(service if isinstance(service, str) else None, slice_urls(obj))
