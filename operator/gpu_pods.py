"""What a real engine's pod needs beyond the sim node's (pure): GPUs, GPU nodes, volumes,
probes on the engine's health path and time to drain.

A replica's chips are requested as `nvidia.com/gpu` (requests = limits), nodes are selected
by the accelerator's `nvidia.com/gpu.product` label (catalog `gpu_product`) and the usual
`nvidia.com/gpu` NoSchedule taint is tolerated. Weights are cached on the model-cache volume
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
    "ENGINE_TERMINATION_GRACE_S",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "GPU_TOLERATION",
    "HEALTH_PATH",
    "MODEL_CACHE_PATH",
    "EnginePodParts",
    "engine_pod_parts",
]

Manifest = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TOLERATION: Manifest = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
#: vLLM's and SGLang's health endpoint (200 once the engine serves; 5xx when it has died).
HEALTH_PATH = "/health"
MODEL_CACHE_PATH = "/model-cache"
#: Streams in flight when a pod is told to stop get this long to finish: 8k tokens at the
#: batched tier's ~65 tokens/s, and some slack.
ENGINE_TERMINATION_GRACE_S = 180
#: Loading (and the first time, downloading) weights: up to 30 minutes before the engine is
#: declared failed to start.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 180


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


def _probe(period_s: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": HTTP_PORT_NAME},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def _resources(spec: InferencePoolSpec, chips: int) -> Manifest:
    """The template's resources with the replica's GPUs in both requests and limits."""
    own = spec.template.resources if spec.template else None
    requests = dict(own.requests) if own else {}
    limits = dict(own.limits) if own else {}
    requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(chips)
    return {"requests": requests, "limits": limits}


def _env(spec: InferencePoolSpec) -> list[Manifest]:
    env: list[Manifest] = [
        {"name": "HOME", "value": "/tmp"},
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
    return EnginePodParts(
        env=_env(spec),
        resources=_resources(spec, layout.chips),
        node_selector=selector,
        tolerations=tolerations,
        volumes=[
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "model-cache", **cache},
        ],
        volume_mounts=[
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": MODEL_CACHE_PATH},
        ],
        probes={
            "startupProbe": _probe(STARTUP_PERIOD_S, STARTUP_FAILURES),
            "readinessProbe": _probe(5, 3),
            "livenessProbe": _probe(10, 6),
        },
    )
