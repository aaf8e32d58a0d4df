"""The performance model: pure functions from (model, hardware, batch) to time and cost."""

from .capacity import Resident, SloCapacity, slo_capacity
from .deployment import (
    Deployment,
    PerfConfigError,
    Speculative,
    chips_to_hold,
    default_tensor_parallel,
    holds_whole_context,
)
from .seeds import evaluate_seed_tiers, load_seed_tiers
from .spec import (
    BatchingSpec,
    PricingSpec,
    ProfileSource,
    ServingSpec,
    SpeculativeSpec,
    build_deployment,
    context_problem,
    layered_catalog,
    profile_label,
    profile_sources,
)
from .steady_state import (
    Batching,
    PerfResult,
    StepBreakdown,
    Workload,
    evaluate,
    max_running,
    unfit,
)
from .step import IDLE, StepTerms, step_terms, touched_expert_fraction

__all__ = [
    "IDLE",
    "Batching",
    "BatchingSpec",
    "PricingSpec",
    "ProfileSource",
    "ServingSpec",
    "Resident",
    "SloCapacity",
    "SpeculativeSpec",
    "build_deployment",
    "context_problem",
    "holds_whole_context",
    "layered_catalog",
    "profile_label",
    "profile_sources",
    "evaluate_seed_tiers",
    "load_seed_tiers",
    "Deployment",
    "PerfConfigError",
    "PerfResult",
    "Speculative",
    "StepBreakdown",
    "StepTerms",
    "Workload",
    "chips_to_hold",
    "default_tensor_parallel",
    "evaluate",
    "max_running",
    "unfit",
    "slo_capacity",
    "step_terms",
    "touched_expert_fraction",
]
