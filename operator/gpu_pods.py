"""What a real engine's pod needs beyond the sim node's (pure): GPUs, GPU nodes, volumes,
probes on the engine's health path and time to drain.

A replica's chips are requested as `nvidia.com/gpu` (requests = limits), with CPU and memory
requests that grow with them unless the pool's template names its own; nodes are selected by
the accelerator's `nvidia.com/gpu.product` label (catalog `gpu_product`) and the usual
`nvidia.com/gpu` NoSchedule taint is tolerated. /dev/shm is a memory-backed emptyDir with a
size limit (it counts against the pod's memory). Weights are cached on the model-cache volume
(an emptyDir, or the PersistentVolumeClaim the operator is given) under `HF_HOME`; the
engines' other caches go to /tmp (`HOME`): the root filesystem stays read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiergate.pools import HTTP_PORT_NAME, InferencePoolSpec, Layout
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf.spec import layered_catalog

__all__ = [
    "CPU_PER_CHIP",
    "ENGINE_TERMINATION_GRACE_S",
    "PROGRESS_DEADLINE_S",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "GPU_TOLERATION",
    "HEALTH_PATH",
    "MEMORY_GIB_PER_CHIP",
    "MODEL_CACHE_PATH",
    "PROBE_TIMEOUT_S",
    "VLLM_SHUTDOWN_TIMEOUT_S",
    "EnginePodParts",
    "engine_pod_parts",
    "shm_size_gib",
]

Manifest = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TOLERATION: Manifest = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
#: vLLM's and SGLang's health endpoint (200 once the engine serves; 5xx when it has died).
HEALTH_PATH = "/health"
#: How long a probe of it may take. vLLM answers at once; SGLang's generates a token, or waits
#: for any output of the engine, at least a second and up to 20 (its
#: SGLANG_HEALTH_CHECK_TIMEOUT) before it says 503: a busy engine prefilling one long prompt
#: sends nothing for seconds, and a shorter timeout would take it out of service.
PROBE_TIMEOUT_S = {"vllm": 5, "sglang": 25}
MODEL_CACHE_PATH = "/model-cache"
#: Streams in flight when a pod is told to stop get this long to finish: 8k tokens at the
#: batched tier's ~65 tokens/s, and some slack.
ENGINE_TERMINATION_GRACE_S = 180
#: What vLLM is told to give them (`--shutdown-timeout`; its default, 0, aborts every request
#: in flight on SIGTERM): the grace period less ten seconds to exit before the SIGKILL. SGLang
#: waits for its requests of itself.
VLLM_SHUTDOWN_TIMEOUT_S = ENGINE_TERMINATION_GRACE_S - 10
#: Loading (and the first time, downloading) weights: up to 30 minutes before the engine is
#: declared failed to start.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 180
#: How long a GPU pool's Deployment waits for a new pod to become ready before it calls the
#: rollout stuck: the startup window above, and 15 minutes to pull an engine image (some GB)
#: before it. The Deployment's default, 10 minutes, would call a cold start stuck.
PROGRESS_DEADLINE_S = STARTUP_PERIOD_S * STARTUP_FAILURES + 15 * 60
#: Requested for each chip of a replica unless the pool's template names its own: what vLLM's
#: Kubernetes guide (vllm-project/vllm, docs/deployment/k8s.md) asks for its one-GPU pod, 2
#: CPUs and 6G of memory, times the chips, since the engine runs a worker process for each GPU.
#: The memory covers /dev/shm below, which is charged to the pod.
CPU_PER_CHIP = 2
MEMORY_GIB_PER_CHIP = 6
#: /dev/shm: the same guide gives its one-GPU pod 2Gi; between a replica's GPUs NCCL and the
#: engine's queue to its workers use it, so one GiB a chip past two.
SHM_MIN_GIB = 2


@dataclass(frozen=True, slots=True)
class EnginePodParts:
    """The pieces of a real engine's pod spec (merged with the pool's template by render)."""

    env: list[Manifest]
    resources: Manifest
    node_selector: dict[str, str]
    tolerations: list[Manifest]
    volumes: list[Manifest]
    volume_mounts: list[Manifest]
    probes: Manifest
    termination_grace_s: int = ENGINE_TERMINATION_GRACE_S


def _probe(period_s: int, failures: int, timeout_s: int) -> Manifest:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": HTTP_PORT_NAME},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": timeout_s,
    }


def shm_size_gib(chips: int) -> int:
    """The size limit of a replica's /dev/shm, in GiB."""
    return max(SHM_MIN_GIB, chips)


def _resources(spec: InferencePoolSpec, chips: int) -> Manifest:
    """The template's resources with the replica's GPUs in both requests and limits, and CPU
    and memory requests for its chips where the template names neither a request nor a limit
    of that resource (Kubernetes takes a limit without a request as the request too)."""
    own = spec.template.resources if spec.template else None
    requests = dict(own.requests) if own else {}
    limits = dict(own.limits) if own else {}
    defaults = {"cpu": str(CPU_PER_CHIP * chips), "memory": f"{MEMORY_GIB_PER_CHIP * chips}Gi"}
    for resource, quantity in defaults.items():
        if resource not in requests and resource not in limits:
            requests[resource] = quantity
    requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(chips)
    return {"requests": requests, "limits": limits}


#: $USER in an engine's pod. The pod runs as a uid the engine's image has no /etc/passwd entry
#: for (the chart's runAsUser, or the random one OpenShift gives), and Python's
#: getpass.getuser(), which torch's compile cache names its folder by when vLLM compiles the
#: model's graphs, reads $LOGNAME or $USER first and otherwise fails looking the uid up
#: (KeyError: 'getpwuid(): uid not found'): the engine would exit at start, over and over.
ENGINE_USER = "tiergate"


def _env(spec: InferencePoolSpec) -> list[Manifest]:
    env: list[Manifest] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "USER", "value": ENGINE_USER},
        {"name": "HF_HOME", "value": f"{MODEL_CACHE_PATH}/huggingface"},
    ]
    token = spec.hugging_face_token_secret_ref
    if token is not None:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}},
            }
        )
    return env


def engine_pod_parts(
    spec: InferencePoolSpec, layout: Layout, model_cache_claim: str | None
) -> EnginePodParts:
    """The GPU, scheduling, volume and probe parts of a vllm or sglang pool's pod."""
    template = spec.template
    accelerator = layered_catalog(spec, default_catalog()).accelerators.get(spec.accelerator or "")
    selector: dict[str, str] = {}
    if accelerator is not None and accelerator.gpu_product:
        selector[GPU_PRODUCT_LABEL] = accelerator.gpu_product
    if template is not None:
        selector.update(template.node_selector)  # the pool's own word wins
    tolerations = [GPU_TOLERATION]
    if template is not None:
        tolerations += [
            t.model_dump(by_alias=True, exclude_none=True) for t in template.tolerations
        ]
    cache: Manifest = (
        {"persistentVolumeClaim": {"claimName": model_cache_claim}}
        if model_cache_claim
        else {"emptyDir": {}}
    )
    timeout = PROBE_TIMEOUT_S[spec.engine]
    return EnginePodParts(
        env=_env(spec),
        resources=_resources(spec, layout.chips),
        node_selector=selector,
        tolerations=tolerations,
        volumes=[
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_size_gib(layout.chips)}Gi"},
            },
            {"name": "model-cache", **cache},
        ],
        volume_mounts=[
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": MODEL_CACHE_PATH},
        ],
        probes={
            "startupProbe": _probe(STARTUP_PERIOD_S, STARTUP_FAILURES, timeout),
            "readinessProbe": _probe(5, 3, timeout),
            "livenessProbe": _probe(10, 6, timeout),
        },
    )
