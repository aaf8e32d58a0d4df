"""Manifests for one InferencePool: a Deployment of `tiergate sim-node` and its Service.

Pure functions of (pool name, namespace, spec, image): the handlers apply what these return,
so reconciling twice, or after a restart, writes the same objects. Every pod carries the
labels, the annotation and the port name of `api.sim_node_pods`: that is how the router finds
a pool's endpoints (it watches the pods themselves) and which model names each answers to.
The Service, named after the pool with port `http`, is for in-cluster clients that want one
address per pool.
"""

from __future__ import annotations

from typing import Any

from tiergate.sim_nodes.replica_spec import pool_json

from .api import (
    HTTP_PORT_NAME,
    SERVES_ANNOTATION,
    InferencePoolSpec,
    Layout,
    pool_selector_labels,
    serves_annotation,
)

__all__ = [
    "CONTAINER_PORT",
    "FIELD_MANAGER",
    "GENERATION_ANNOTATION",
    "deployment_manifest",
    "pod_labels",
    "service_manifest",
    "sim_node_args",
]

Manifest = dict[str, Any]

#: The sim node's port inside the pod.
CONTAINER_PORT = 8000
#: The field manager of every server-side apply the operator makes.
FIELD_MANAGER = "tiergate-operator"
#: Default resources of a sim node (one Python process; it simulates, it does not compute).
DEFAULT_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}
UID = 10001
#: On a pool's Deployment (not its pods: that would roll them): the pool's metadata.generation
#: the Deployment was last applied from, so a status can say which spec its pods run.
GENERATION_ANNOTATION = "tiergate.dev/pool-generation"


def pod_labels(pool: str, spec: InferencePoolSpec) -> dict[str, str]:
    extra = spec.template.labels if spec.template else {}
    return {
        **extra,
        **pool_selector_labels(pool),
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": "sim-node",
        "app.kubernetes.io/part-of": "tiergate",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        "tiergate.dev/tier": spec.tier,
    }


def sim_node_args(spec: InferencePoolSpec, layout: Layout) -> list[str]:
    """The container's args: `tiergate sim-node` on the pod's port, named after the pod, given
    the pool's spec whole (`--pool-json`) with the layout the envelope was computed for."""
    spec_json = pool_json(spec, chips=layout.chips, tensor_parallel=layout.tensor_parallel)
    return [
        "sim-node",
        "--host", "0.0.0.0",
        "--port", str(CONTAINER_PORT),
        "--node-name", "$(POD_NAME)",
        # Kubernetes expands $(VAR) in args and reads $$ as $: a `$` of the spec (a name may
        # hold one) is doubled so that the node gets it as written.
        "--pool-json", spec_json.replace("$", "$$"),
    ]  # fmt: skip


def _probe(path: str, period_s: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT_NAME},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def _resources(spec: InferencePoolSpec) -> Manifest:
    own = spec.template.resources if spec.template else None
    if own is None:
        return DEFAULT_RESOURCES
    return {k: v for k, v in (("requests", own.requests), ("limits", own.limits)) if v}


def _scheduling(spec: InferencePoolSpec) -> Manifest:
    template = spec.template
    if template is None:
        return {}
    out: Manifest = {}
    if template.node_selector:
        out["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        out["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in template.tolerations
        ]
    return out


def deployment_manifest(
    pool: str,
    namespace: str,
    spec: InferencePoolSpec,
    image: str,
    layout: Layout,
    generation: int | None = None,
) -> Manifest:
    """The pool's Deployment (owner reference added by the caller); `generation`: the pool's
    metadata.generation, recorded in `GENERATION_ANNOTATION`."""
    labels = pod_labels(pool, spec)
    metadata: Manifest = {"name": pool, "namespace": namespace, "labels": labels}
    if generation is not None:
        metadata["annotations"] = {GENERATION_ANNOTATION: str(generation)}
    image = spec.template.image if spec.template and spec.template.image else image
    container = {
        "name": "sim-node",
        "image": image,
        "args": sim_node_args(spec, layout),
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "readinessProbe": _probe("/ready", 2, 3),
        "livenessProbe": _probe("/health", 10, 3),
        "resources": _resources(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": pool_selector_labels(pool)},
            "template": {
                "metadata": {
                    "labels": labels,
                    # What the router may send these pods: the names of the spec they run.
                    "annotations": {SERVES_ANNOTATION: serves_annotation(spec.names)},
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": UID,
                        "fsGroup": UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    **_scheduling(spec),
                },
            },
        },
    }


def service_manifest(pool: str, namespace: str, spec: InferencePoolSpec) -> Manifest:
    """The pool's Service: named after the pool, port `http`, selecting the pool's pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": pool, "namespace": namespace, "labels": pod_labels(pool, spec)},
        "spec": {
            "selector": pool_selector_labels(pool),
            "ports": [
                {
                    "name": HTTP_PORT_NAME,
                    "port": CONTAINER_PORT,
                    "targetPort": HTTP_PORT_NAME,
                    "protocol": "TCP",
                }
            ],  # fmt: skip
        },
    }
