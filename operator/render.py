"""Manifests for one InferencePool: a Deployment of its engine's pods and its Service.

Pure functions of (pool name, namespace, spec, image, layout): the handlers apply what these
return, and `tiergate render` prints the same, so reconciling twice, or after a restart, or on
paper, gives the same objects. Every pod runs `vllm serve`'s command line for the pool
(`engine_args`): the sim node (engine `sim`, the default) on the sim image, with the whole spec
in `POOL_JSON_ENV` for what the flags cannot say (accelerator, chips, inline profiles, load);
vLLM on GPUs; or SGLang's own line. Real engines' pods get GPUs, nodes and volumes from
`gpu_pods`. Every pod carries the labels, the annotation and the port name of
`api.sim_node_pods`: that is how the router finds a pool's endpoints and which model names
each answers to. The Service, named after the pool with port `http`, is for in-cluster
clients that want one address per pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiergate.pools import (
    HTTP_PORT_NAME,
    SERVES_ANNOTATION,
    InferencePoolSpec,
    Layout,
    pool_selector_labels,
    serves_annotation,
)
from tiergate.sim_nodes.replica_spec import NODE_NAME_ENV, POOL_JSON_ENV, pool_json

from .engine_args import (
    CONTAINER_PORT,
    SGLANG_COMMAND,
    VLLM_COMMAND,
    sglang_args,
    vllm_args,
)
from .gpu_pods import PROGRESS_DEADLINE_S, VLLM_SHUTDOWN_TIMEOUT_S, engine_pod_parts

__all__ = [
    "CONTAINER_PORT",
    "DEFAULT_POD_SETTINGS",
    "DEFAULT_RUN_AS",
    "FIELD_MANAGER",
    "GENERATION_ANNOTATION",
    "NODE_NAME_ENV",
    "POOL_JSON_ENV",
    "SIM_COMMAND",
    "PodSettings",
    "RunAs",
    "container_command",
    "progress_deadline_s",
    "deployment_manifest",
    "pod_labels",
    "pool_manifests",
    "service_manifest",
]

Manifest = dict[str, Any]

#: The field manager of every server-side apply the operator makes.
FIELD_MANAGER = "tiergate-operator"
#: Default resources of a sim node (one Python process; it simulates, it does not compute).
DEFAULT_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}
#: On a pool's Deployment (not its pods: that would roll them): the pool's metadata.generation
#: the Deployment was last applied from, so a status can say which spec its pods run.
GENERATION_ANNOTATION = "tiergate.dev/pool-generation"
#: The sim image's command: `tiergate sim-node`, given `vllm serve`'s arguments.
SIM_COMMAND = ["tiergate", "sim-node"]


@dataclass(frozen=True, slots=True)
class RunAs:
    """The non-root user and group a pool's pods run as (the chart's runAsUser / runAsGroup,
    passed on by the operator's --run-as-user / --run-as-group)."""

    user: int
    group: int


#: The image's own USER (Dockerfile), and the chart's default.
DEFAULT_RUN_AS = RunAs(user=10001, group=10001)


@dataclass(frozen=True, slots=True)
class PodSettings:
    """What every pool's pods get from the operator's own settings (the chart's values)."""

    #: The non-root user and group they run as.
    run_as: RunAs = DEFAULT_RUN_AS
    #: The PersistentVolumeClaim real engines cache weights on (None: an emptyDir per pod).
    model_cache_claim: str | None = None
    #: Secrets to pull their images with (each pool's spec.template.imagePullSecrets follow).
    pull_secrets: tuple[str, ...] = ()


#: The chart's defaults: the image's own user, an emptyDir for weights, no pull secrets.
DEFAULT_POD_SETTINGS = PodSettings()


def pod_labels(pool: str, spec: InferencePoolSpec) -> dict[str, str]:
    extra = spec.template.labels if spec.template else {}
    return {
        **extra,
        **pool_selector_labels(pool),
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": "sim-node" if spec.engine == "sim" else spec.engine,
        "app.kubernetes.io/part-of": "tiergate",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        "tiergate.dev/tier": spec.tier,
        "tiergate.dev/engine": spec.engine,
    }


#: A Deployment's progressDeadlineSeconds when it sets none (a sim pool's).
DEFAULT_PROGRESS_DEADLINE_S = 600


def progress_deadline_s(spec: InferencePoolSpec) -> int:
    """How long the pool's Deployment waits for a new pod to become ready before it calls a
    rollout stuck: a real engine's pull and weight load, else Kubernetes' default."""
    return DEFAULT_PROGRESS_DEADLINE_S if spec.engine == "sim" else PROGRESS_DEADLINE_S


def _literal(text: str) -> str:
    """`text` as Kubernetes passes it on: the kubelet expands `$(VAR)` in args and env values
    and reads `$$` as `$`, so a `$` of the spec (a name may hold one) is doubled."""
    return text.replace("$", "$$")


def container_command(spec: InferencePoolSpec, layout: Layout) -> tuple[list[str], list[str]]:
    """The container's (command, args) for the pool's engine: `vllm serve`'s arguments for vLLM
    and the sim node alike, SGLang's own for SGLang. vLLM is told to let the requests in
    flight finish when its pod stops (the sim node does so of itself)."""
    if spec.engine == "sglang":
        return list(SGLANG_COMMAND), [_literal(a) for a in sglang_args(spec, layout)]
    if spec.engine == "sim":
        return list(SIM_COMMAND), [_literal(a) for a in vllm_args(spec, layout)]
    args = vllm_args(spec, layout, shutdown_timeout_s=VLLM_SHUTDOWN_TIMEOUT_S)
    return list(VLLM_COMMAND), [_literal(a) for a in args]


def _sim_env(spec: InferencePoolSpec, layout: Layout) -> list[Manifest]:
    """The sim node's extra environment: the spec whole, with the layout the envelope was
    computed for, and its pod's name."""
    spec_json = pool_json(spec, chips=layout.chips, tensor_parallel=layout.tensor_parallel)
    return [
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": NODE_NAME_ENV, "value": "$(POD_NAME)"},
        {"name": POOL_JSON_ENV, "value": _literal(spec_json)},
    ]


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


def _container_security(run_as: RunAs) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": run_as.user,
        "runAsGroup": run_as.group,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_spec(
    spec: InferencePoolSpec, image: str, layout: Layout, settings: PodSettings
) -> Manifest:
    """The pod's spec: the engine's container, locked down, and what the engine needs."""
    run_as = settings.run_as
    command, args = container_command(spec, layout)
    env: list[Manifest] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    container: Manifest = {
        "name": "sim-node" if spec.engine == "sim" else spec.engine,
        "image": image,
        "command": command,
        "args": args,
        "env": env,
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
    }
    volumes: list[Manifest] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[Manifest] = [{"name": "tmp", "mountPath": "/tmp"}]
    pod: Manifest = {}
    if spec.engine == "sim":
        env += _sim_env(spec, layout)
        container["readinessProbe"] = _probe("/ready", 2, 3)
        container["livenessProbe"] = _probe("/health", 10, 3)
        container["resources"] = _resources(spec)
        pod.update(_scheduling(spec))
    else:
        parts = engine_pod_parts(spec, layout, settings.model_cache_claim)
        env += parts.env
        container.update(parts.probes)
        container["resources"] = parts.resources
        volumes += parts.volumes
        mounts += parts.volume_mounts
        pod["nodeSelector"] = parts.node_selector
        pod["tolerations"] = parts.tolerations
        pod["terminationGracePeriodSeconds"] = parts.termination_grace_s
    container["securityContext"] = _container_security(run_as)
    container["volumeMounts"] = mounts
    pod["imagePullSecrets"] = [{"name": name} for name in _pull_secrets(spec, settings)]
    return {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": run_as.user,
            "fsGroup": run_as.group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
        **{k: v for k, v in pod.items() if v},
    }


def _pull_secrets(spec: InferencePoolSpec, settings: PodSettings) -> list[str]:
    """The operator's pull secrets, then the pool's own, each once."""
    own = [ref.name for ref in spec.template.image_pull_secrets] if spec.template else []
    return list(dict.fromkeys([*settings.pull_secrets, *own]))


def deployment_manifest(
    pool: str,
    namespace: str,
    spec: InferencePoolSpec,
    image: str,
    layout: Layout,
    generation: int | None = None,
    *,
    settings: PodSettings = DEFAULT_POD_SETTINGS,
) -> Manifest:
    """The pool's Deployment (owner reference added by the caller); `image`: the engine's
    (a pool's spec.template.image wins); `generation`: the pool's metadata.generation,
    recorded in `GENERATION_ANNOTATION`; `settings`: the operator's for every pool's pods."""
    labels = pod_labels(pool, spec)
    metadata: Manifest = {"name": pool, "namespace": namespace, "labels": labels}
    if generation is not None:
        metadata["annotations"] = {GENERATION_ANNOTATION: str(generation)}
    image = spec.template.image if spec.template and spec.template.image else image
    # What the router may send these pods: the names they answer to (SGLang serves one).
    names = spec.names[:1] if spec.engine == "sglang" else spec.names
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": spec.replicas,
            **({} if spec.engine == "sim" else {"progressDeadlineSeconds": PROGRESS_DEADLINE_S}),
            **({} if spec.rollout is None else {"strategy": spec.rollout.strategy()}),
            "selector": {"matchLabels": pool_selector_labels(pool)},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {SERVES_ANNOTATION: serves_annotation(names)},
                },
                "spec": _pod_spec(spec, image, layout, settings),
            },
        },
    }


def pool_manifests(
    pool: str,
    namespace: str,
    spec: InferencePoolSpec,
    image: str,
    layout: Layout,
    generation: int | None = None,
    *,
    settings: PodSettings = DEFAULT_POD_SETTINGS,
) -> tuple[Manifest, Manifest]:
    """The pool's Deployment and Service, as the operator applies them (before it adds its
    owner reference) and `tiergate render` prints them."""
    deployment = deployment_manifest(
        pool,
        namespace,
        spec,
        image,
        layout,
        generation,
        settings=settings,
    )
    return deployment, service_manifest(pool, namespace, spec)


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
