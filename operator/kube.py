"""The operator's writes to the Kubernetes API, behind a small interface.

`Cluster` is what reconciliation needs: server-side apply of a manifest (idempotent: the same
manifest twice changes nothing), reading an object's metadata (whose it is) and a Deployment's
status. `KubeCluster` is the real one (the official `kubernetes` client; kopf runs sync
handlers in threads); tests pass a fake. A transient API failure raises `kopf.TemporaryError`
so kopf retries with backoff; a manifest the API server refuses as invalid raises
`ApplyRejected`, which retrying cannot mend.

The autoscaler reads the pool's pods (address, readiness), the router's pods (to read their
queues) and the HPAs of the pool's namespace, and writes `spec.replicas` through the pool's
scale subresource, as an HPA would. Behind a gateway, it keeps a Gateway API Inference
Extension InferencePool beside the pools (`gateway_pool`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tiergate.pools import GROUP, KIND, PLURAL, VERSION, label_selector, pool_selector_labels

from .autoscaling import HpaUnknown
from .gateway_pool import GATEWAY_GROUP, GATEWAY_VERSION, GatewayApi, GatewayPoolMissing
from .render import FIELD_MANAGER
from .status import rebase_conditions

__all__ = [
    "ApplyRejected",
    "Cluster",
    "KubeCluster",
    "PodAddress",
    "RoutersUnknown",
    "current_namespace",
    "load_kube_config",
]

Manifest = dict[str, Any]

#: Seconds before a request to the API server is abandoned (a stalled call must not hang).
REQUEST_TIMEOUT_S = 30
#: Writes of a pool's status tried over a fresh read when another write came between.
STATUS_ATTEMPTS = 5
RETRY_DELAY_S = 10


class RoutersUnknown(Exception):
    """The router's pods could not be listed: what waits in their queues is unknown."""


class ApplyRejected(Exception):
    """The API server refused a manifest as invalid (400, 422) or forbade it (403: an
    admission webhook's policy, or the operator's RBAC): applying it again cannot help until
    the spec, the policy or the permission changes. The pool's status says so (the resync
    timer applies it again once that is mended)."""


@dataclass(frozen=True, slots=True)
class PodAddress:
    """One of a pool's pods, as the autoscaler scrapes it and the status tells of it."""

    name: str
    ip: str | None
    ready: bool
    #: Why the pod cannot start, when it cannot: the scheduler's word (Unschedulable) or a
    #: container's (ImagePullBackOff, CrashLoopBackOff, ...), with its message. None: it
    #: runs, or is on its way.
    problem: str | None = None
    #: On its way to serving: not created yet, or a container not past its startup probe
    #: (`started` false: a real engine loading weights; without a startup probe a container
    #: counts as started once it runs). A pod that lost its readiness while running is not.
    starting: bool = False
    #: Seconds since the pod was created, as it was listed (None: not said).
    age_s: float | None = None


#: A container waiting for one of these is not on its way: it needs someone to act.
CANNOT_START = frozenset({
    "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "ErrImageNeverPull",
    "ErrImagePull", "ImageInspectError", "ImagePullBackOff", "InvalidImageName",
    "RunContainerError",
})  # fmt: skip


class Cluster(GatewayApi, Protocol):
    def apply(self, manifest: Manifest) -> None: ...

    def metadata(self, kind: str, namespace: str, name: str) -> Manifest | None: ...

    def delete(self, kind: str, namespace: str, name: str) -> None: ...

    def deployment_status(self, namespace: str, name: str) -> Manifest | None:
        """The Deployment's `status`, with its `metadata.generation` as `generation` (what
        `status.observedGeneration` is compared with); None: there is no Deployment."""
        ...

    def pool(self, namespace: str, name: str) -> Manifest | None: ...

    def patch_pool_status(
        self, namespace: str, name: str, status: Manifest, base: Manifest | None = None
    ) -> None:
        """Write `status`, computed from the pool's status `base`: its conditions rebased on
        the pool's as they are now (`rebase_conditions`), so that a write made meanwhile by
        another writer is kept. None: written as it is."""
        ...

    def pool_pods(self, namespace: str, pool: str) -> list[PodAddress]: ...

    def router_pods(self, namespace: str, selector: str) -> list[PodAddress]: ...

    def hpa_targeting(self, namespace: str, pool: str) -> str | HpaUnknown | None: ...

    def scale_pool(self, namespace: str, pool: str, replicas: int) -> None: ...


def load_kube_config(kubeconfig: str | None = None) -> None:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]


#: Where Kubernetes mounts a pod's own namespace.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def current_namespace(kubeconfig: str | None = None, namespace_file: Path = NAMESPACE_FILE) -> str:
    """The operator's own namespace: its pod's, else the kubeconfig's current context's, else
    `default` (where kubectl would put a pool given no namespace)."""
    try:
        own = namespace_file.read_text(encoding="utf-8").strip()
    except OSError:
        own = ""
    if own:
        return own
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError):
        return "default"
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


def _message(exc: ApiException) -> str:
    """The API server's own words (its Status message), else the HTTP reason."""
    reason = exc.reason or "error"
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(reason)
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or reason)


def _problem(status: Any) -> str | None:
    """Why a pod (its `status`, a V1PodStatus) cannot start; None: it can."""
    if status is None:
        return None
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return f"Unschedulable: {condition.message or 'no node fits it'}"
    containers = [*(status.init_container_statuses or []), *(status.container_statuses or [])]
    for container in containers:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in CANNOT_START:
            return f"{waiting.reason}: {waiting.message or container.name}"
    return None


def _starting(status: Any) -> bool:
    """Whether a pod (its `status`, a V1PodStatus) has not started yet: no container created,
    or one whose `started` is not true."""
    containers = (status.container_statuses if status else None) or []
    return not containers or any(not c.started for c in containers)


def _temporary(action: str, exc: ApiException) -> kopf.TemporaryError:
    return kopf.TemporaryError(f"{action}: HTTP {exc.status}: {_message(exc)}", delay=RETRY_DELAY_S)


class KubeCluster:
    """`Cluster` over the official client."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self._apps = client.AppsV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._autoscaling = client.AutoscalingV2Api(api_client)

    def apply(self, manifest: Manifest) -> None:
        meta = manifest["metadata"]
        kind, namespace, name = manifest["kind"], meta["namespace"], meta["name"]
        patch = {
            "Deployment": self._apps.patch_namespaced_deployment,
            "Service": self._core.patch_namespaced_service,
        }[kind]
        try:
            patch(
                name,
                namespace,
                manifest,
                field_manager=FIELD_MANAGER,
                force=True,  # the operator owns these objects' fields
                _content_type="application/apply-patch+yaml",
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as exc:
            action = f"apply {kind} {namespace}/{name}"
            if exc.status in (400, 403, 422):
                raise ApplyRejected(f"the API server rejected {kind} {namespace}/{name} "
                                    f"(HTTP {exc.status}): {_message(exc)}") from None  # fmt: skip
            raise _temporary(action, exc) from None

    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete the Deployment or Service `name` (gone already: nothing to do)."""
        remove = {
            "Deployment": self._apps.delete_namespaced_deployment,
            "Service": self._core.delete_namespaced_service,
        }[kind]
        try:
            remove(name, namespace, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status != 404:
                raise _temporary(f"delete {kind} {namespace}/{name}", exc) from None

    def metadata(self, kind: str, namespace: str, name: str) -> Manifest | None:
        """The metadata of the Deployment or Service `name` (None: there is none)."""
        read = {
            "Deployment": self._apps.read_namespaced_deployment,
            "Service": self._core.read_namespaced_service,
        }[kind]
        try:
            obj = read(name, namespace, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _temporary(f"read {kind} {namespace}/{name}", exc) from None
        sanitize = client.ApiClient().sanitize_for_serialization
        meta = sanitize(getattr(obj, "metadata", None))  # type: ignore[no-untyped-call]
        return meta if isinstance(meta, dict) else {}

    def deployment_status(self, namespace: str, name: str) -> Manifest | None:
        try:
            # GET on the Deployment itself: it carries the status, and `get deployments` is what
            # the operator's Role grants (deployments/status would be a second permission).
            deployment = self._apps.read_namespaced_deployment(
                name, namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _temporary(f"read Deployment {namespace}/{name}", exc) from None
        status = client.ApiClient().sanitize_for_serialization(  # type: ignore[no-untyped-call]
            deployment.status
        )
        generation = deployment.metadata.generation if deployment.metadata else None
        return {**(status if isinstance(status, dict) else {}), "generation": generation}

    def pool(self, namespace: str, name: str) -> Manifest | None:
        try:
            obj = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _temporary(f"read InferencePool {namespace}/{name}", exc) from None
        return obj if isinstance(obj, dict) else None

    def list_pools(self, namespace: str) -> list[Manifest]:
        """Every tiergate InferencePool of `namespace`."""
        try:
            listed = self._custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            raise _temporary(f"list InferencePools in {namespace}", exc) from None
        items = listed.get("items") if isinstance(listed, dict) else None
        return [item for item in items or [] if isinstance(item, dict)]

    def apply_gateway_pool(self, manifest: Manifest) -> None:
        """Server-side apply of a GIE InferencePool (`gateway_pool`); GatewayPoolMissing when
        the API server does not know the kind."""
        meta = manifest["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        where = f"{GATEWAY_GROUP} InferencePool {namespace}/{name}"
        try:
            self._custom.patch_namespaced_custom_object(
                GATEWAY_GROUP, GATEWAY_VERSION, namespace, "inferencepools", name, manifest,
                field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml",
                _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                raise GatewayPoolMissing(
                    f"cannot create {where}: the API server has no "
                    f"inferencepools.{GATEWAY_GROUP}/{GATEWAY_VERSION} (install the Gateway API "
                    "Inference Extension's CRD, or the chart's gatewayPool.installCRD)"
                ) from None
            if exc.status in (400, 403, 422):
                raise ApplyRejected(
                    f"the API server rejected {where} (HTTP {exc.status}): {_message(exc)}"
                ) from None
            raise _temporary(f"apply {where}", exc) from None

    def delete_gateway_pool(self, namespace: str, name: str) -> None:
        """Delete the GIE InferencePool `name` (gone already, or no such kind: nothing to do)."""
        try:
            self._custom.delete_namespaced_custom_object(
                GATEWAY_GROUP, GATEWAY_VERSION, namespace, "inferencepools", name,
                _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status != 404:
                where = f"{GATEWAY_GROUP} InferencePool {namespace}/{name}"
                raise _temporary(f"delete {where}", exc) from None

    def patch_pool_status(
        self, namespace: str, name: str, status: Manifest, base: Manifest | None = None
    ) -> None:
        """A merge patch replaces a list whole: with `base`, the conditions are rebased on the
        pool's current ones and written only over that version of the pool (its
        resourceVersion), read again and rebased again if another write came between."""
        for _ in range(STATUS_ATTEMPTS):
            body: Manifest = {"status": status}
            if base is not None and "conditions" in status:
                current = self.pool(namespace, name)
                if current is None:
                    return  # deleted meanwhile: nothing to report on
                theirs = (current.get("status") or {}).get("conditions") or []
                ours = rebase_conditions(base.get("conditions") or [], status["conditions"], theirs)
                version = (current.get("metadata") or {}).get("resourceVersion")
                body = {"metadata": {"resourceVersion": version},
                        "status": {**status, "conditions": ours}}  # fmt: skip
            try:
                self._custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, body,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )  # fmt: skip
                return
            except ApiException as exc:
                if exc.status == 404:  # deleted meanwhile: nothing to report on
                    return
                if exc.status != 409 or base is None:
                    where = f"patch InferencePool {namespace}/{name} status"
                    raise _temporary(where, exc) from None
        raise kopf.TemporaryError(
            f"patch InferencePool {namespace}/{name} status: changed by another writer "
            f"{STATUS_ATTEMPTS} times in a row", delay=RETRY_DELAY_S,
        )  # fmt: skip

    def pool_pods(self, namespace: str, pool: str) -> list[PodAddress]:
        """The pool's sim-node pods (by its selector labels); ready: the pod's Ready
        condition is True and it is not being deleted."""
        selector = label_selector(pool_selector_labels(pool))
        try:
            return self._pods(namespace, selector)
        except ApiException as exc:
            raise _temporary(f"list the pods of InferencePool {namespace}/{pool}", exc) from None

    def router_pods(self, namespace: str, selector: str) -> list[PodAddress]:
        """The router's pods (`selector`, a label selector), ready as `pool_pods` says.
        Raises RoutersUnknown when they cannot be listed (the message says why)."""
        try:
            return self._pods(namespace, selector)
        except ApiException as exc:
            if exc.status == 403:
                raise RoutersUnknown(f"the operator may not list pods in {namespace}") from None
            raise RoutersUnknown(
                f"listing the router pods in {namespace}: HTTP {exc.status}: {_message(exc)}"
            ) from None

    def _pods(self, namespace: str, selector: str) -> list[PodAddress]:
        pods = self._core.list_namespaced_pod(
            namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_S
        )
        found = []
        for pod in pods.items or []:
            status, meta = pod.status, pod.metadata
            if meta is None:
                continue
            ready = meta.deletion_timestamp is None and any(
                c.type == "Ready" and c.status == "True"
                for c in (status.conditions if status else None) or []
            )
            ip = status.pod_ip if status else None
            starting = not ready and meta.deletion_timestamp is None and _starting(status)
            created = meta.creation_timestamp
            age = None if created is None else time.time() - created.timestamp()
            found.append(PodAddress(str(meta.name), ip, ready, _problem(status), starting, age))
        return found

    def hpa_targeting(self, namespace: str, pool: str) -> str | HpaUnknown | None:
        """The name of a HorizontalPodAutoscaler whose target is the pool (None: none is;
        HpaUnknown: the operator may not list them, so it cannot tell)."""
        try:
            hpas = self._autoscaling.list_namespaced_horizontal_pod_autoscaler(
                namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 403:
                grant = f"list horizontalpodautoscalers.autoscaling in {namespace}"
                return HpaUnknown(grant)
            raise _temporary(f"list HorizontalPodAutoscalers in {namespace}", exc) from None
        for hpa in hpas.items or []:
            target = hpa.spec.scale_target_ref
            api_version = str(target.api_version or "")
            if target.kind == KIND and target.name == pool and api_version.startswith(GROUP):
                return str(hpa.metadata.name if hpa.metadata else "(unnamed)")
        return None

    def scale_pool(self, namespace: str, pool: str, replicas: int) -> None:
        """spec.replicas through the scale subresource (what `kubectl scale` and HPAs use)."""
        try:
            self._custom.patch_namespaced_custom_object_scale(
                GROUP, VERSION, namespace, PLURAL, pool, {"spec": {"replicas": replicas}},
                _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to scale
                raise _temporary(f"scale InferencePool {namespace}/{pool}", exc) from None
