"""Endpoint picking: a pipeline of filters -> weighted scorers in [0, 1] -> picker.

The Gateway API Inference Extension design: each plugin is one module, registered under a
kebab-case type name and configured as `{name, type, parameters}`; a `Sampler` filter
(`random-sample`) bounds the candidates scored, so a request's cost does not grow with the
pool. Build a `Pipeline` with
`Pipeline.from_config(PolicyConfig(...) or default_policy(), pools=..., rng=...)`, then
per request `pipeline.pick(ctx, candidates, now_s)` and, once routed, `pipeline.observe(ctx,
endpoint)`.
"""

from importlib import import_module

from tiergate.router.policy.base import (
    Filter,
    FixedPools,
    NoEndpointFits,
    NoParameters,
    Parameters,
    Picker,
    Plugin,
    PluginContext,
    PoolShapes,
    Sampler,
    Scorer,
)
from tiergate.router.policy.config import PluginSpec, PolicyConfig, ScorerSpec, default_policy
from tiergate.router.policy.latency import LatencyEstimate, LatencyPredictor, endpoint_load
from tiergate.router.policy.pipeline import Pipeline
from tiergate.router.policy.prefix import prefix_hashes
from tiergate.router.policy.registry import PolicyConfigError, known_types, register

#: The built-in plugins, one module each: importing a module registers its plugin.
BUILT_IN = (
    "model_filter",
    "tier_filter",
    "context_filter",
    "random_sample",
    "ejected_filter",
    "slo_filter",
    "predicted_latency_scorer",
    "queue_depth_scorer",
    "kv_cache_scorer",
    "prefix_affinity_scorer",
    "max_score_picker",
    "weighted_random_picker",
)
for _module in BUILT_IN:
    import_module(f"{__name__}.{_module}")

__all__ = [
    "BUILT_IN",
    "Filter",
    "FixedPools",
    "NoEndpointFits",
    "LatencyEstimate",
    "LatencyPredictor",
    "NoParameters",
    "Parameters",
    "Picker",
    "Pipeline",
    "Plugin",
    "PluginContext",
    "PluginSpec",
    "PoolShapes",
    "PolicyConfig",
    "PolicyConfigError",
    "Sampler",
    "Scorer",
    "ScorerSpec",
    "default_policy",
    "endpoint_load",
    "known_types",
    "prefix_hashes",
    "register",
]
