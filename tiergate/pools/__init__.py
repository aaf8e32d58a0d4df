"""The InferencePool API (`tiergate.dev/v1alpha1`) and its performance envelope.

Pure: pydantic models and the performance model, no Kubernetes client, no kopf. The router
imports this package to read InferencePools and to find their pods (`sim_node_pods`: the
labels and port name the operator puts on them); the operator's handlers build on it.
"""

from tiergate.sim_nodes.replica_spec import BackgroundLoad

from .autoscaling import (
    DEFAULT_SCALE_DOWN_STABILIZATION_S,
    DEFAULT_TARGET_UTILIZATION,
    MIN_ABOVE_MAX,
    AutoscalingSpec,
    AutoscalingStatus,
    Recommendation,
)
from .engines import DEFAULT_ENGINE, ENGINES, Engine, EngineDefinition
from .envelope import Layout, PoolPerformance, predict
from .hosted import Billing, HostedEndpoint, SecretKeyRef
from .inference_pool import (
    API_VERSION,
    DNS_LABEL,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    BilledPrice,
    Condition,
    ConditionType,
    Envelope,
    EnvelopeBasis,
    InferencePool,
    InferencePoolSpec,
    InferencePoolStatus,
    ReferenceWorkload,
    Resources,
    SloSpec,
    TemplateSpec,
    Toleration,
    billed_price,
)
from .sim_node_pods import (
    HTTP_PORT_NAME,
    NAME_LABEL,
    POOL_LABEL,
    SERVES_ANNOTATION,
    SIM_NODE_NAME,
    SIM_NODE_SELECTOR,
    label_selector,
    pool_selector_labels,
    served_names,
    serves_annotation,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_SCALE_DOWN_STABILIZATION_S",
    "DEFAULT_TARGET_UTILIZATION",
    "DEFAULT_ENGINE",
    "ENGINES",
    "MIN_ABOVE_MAX",
    "DNS_LABEL",
    "GROUP",
    "HTTP_PORT_NAME",
    "KIND",
    "NAME_LABEL",
    "PLURAL",
    "POOL_LABEL",
    "SERVES_ANNOTATION",
    "SIM_NODE_NAME",
    "SIM_NODE_SELECTOR",
    "VERSION",
    "AutoscalingSpec",
    "AutoscalingStatus",
    "BackgroundLoad",
    "BilledPrice",
    "Billing",
    "Condition",
    "ConditionType",
    "Engine",
    "EngineDefinition",
    "Envelope",
    "EnvelopeBasis",
    "HostedEndpoint",
    "InferencePool",
    "InferencePoolSpec",
    "InferencePoolStatus",
    "Layout",
    "PoolPerformance",
    "Recommendation",
    "ReferenceWorkload",
    "Resources",
    "SecretKeyRef",
    "SloSpec",
    "TemplateSpec",
    "Toleration",
    "billed_price",
    "label_selector",
    "pool_selector_labels",
    "served_names",
    "serves_annotation",
    "predict",
]
