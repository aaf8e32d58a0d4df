"""The performance model: pure functions from (model, hardware, batch) to time and cost."""

from .deployment import (
    Deployment,
    PerfConfigError,
    Speculative,
    chips_to_hold,
    default_tensor_parallel,
)
from .seeds import evaluate_seed_tiers, load_seed_tiers
from .spec import BatchingSpec, PricingSpec, ServingSpec, SpeculativeSpec, build_deployment
from .steady_state import Batching, PerfResult, StepBreakdown, Workload, evaluate, max_running
from .step import IDLE, StepTerms, step_terms, touched_expert_fraction

__all__ = [
    "IDLE",
    "Batching",
    "BatchingSpec",
    "PricingSpec",
    "ServingSpec",
    "SpeculativeSpec",
    "build_deployment",
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
    "step_terms",
    "touched_expert_fraction",
]
