"""The InferencePool API (`tiergate.dev/v1alpha1`) and its performance envelope.

Pure: pydantic models and the performance model, no Kubernetes client, no kopf. The router
imports this package to read InferencePools; the operator's handlers build on it.
"""

from .envelope import PoolPerformance, predict
from .inference_pool import (
    API_VERSION,
    DNS_LABEL,
    GROUP,
    KIND,
    PLURAL,
    PREMIUM_MAX_NUM_SEQS,
    TIERS,
    VERSION,
    BackgroundLoad,
    Condition,
    ConditionType,
    Envelope,
    InferencePool,
    InferencePoolSpec,
    InferencePoolStatus,
    ReferenceWorkload,
    Resources,
    SloSpec,
    TemplateSpec,
    Tier,
    Toleration,
)
from .sim_node_flags import sim_node_flags

__all__ = [
    "API_VERSION",
    "DNS_LABEL",
    "GROUP",
    "KIND",
    "PLURAL",
    "PREMIUM_MAX_NUM_SEQS",
    "TIERS",
    "VERSION",
    "BackgroundLoad",
    "Condition",
    "ConditionType",
    "Envelope",
    "InferencePool",
    "InferencePoolSpec",
    "InferencePoolStatus",
    "PoolPerformance",
    "ReferenceWorkload",
    "Resources",
    "SloSpec",
    "TemplateSpec",
    "Tier",
    "Toleration",
    "predict",
    "sim_node_flags",
]
