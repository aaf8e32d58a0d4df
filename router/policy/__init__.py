"""Endpoint picking: a pipeline of filters -> weighted scorers in [0, 1] -> picker.

The Gateway API Inference Extension design: each plugin is one module, registered under a
kebab-case type name and configured as `{name, type, parameters}`; a `Sampler` filter
(`random-sample`) bounds the candidates scored, so a request's cost does not grow with the
pool. Build a `Pipeline` with
`Pipeline.from_config(PolicyConfig(...) or default_policy(), deployments=..., rng=...)`, then
per request `pipeline.pick(ctx, candidates, now_s)` and, once routed, `pipeline.observe(ctx,
endpoint)`.
"""

# Importing the plugin modules registers them.
from . import (
    ejected_filter,
    kv_cache_scorer,
    max_score_picker,
    model_filter,
    predicted_latency_scorer,
    prefix_affinity_scorer,
    queue_depth_scorer,
    random_sample,
    tier_filter,
    weighted_random_picker,
)
from .base import (
    Filter,
    NoParameters,
    Parameters,
    Picker,
    Plugin,
    PluginContext,
    Sampler,
    Scorer,
)
from .config import PluginSpec, PolicyConfig, ScorerSpec, default_policy
from .latency import LatencyEstimate, LatencyPredictor, endpoint_load
from .pipeline import Pipeline
from .prefix import prefix_hashes
from .registry import PolicyConfigError, known_types, register

del (
    ejected_filter,
    kv_cache_scorer,
    max_score_picker,
    model_filter,
    predicted_latency_scorer,
    prefix_affinity_scorer,
    queue_depth_scorer,
    random_sample,
    tier_filter,
    weighted_random_picker,
)

__all__ = [
    "Filter",
    "LatencyEstimate",
    "LatencyPredictor",
    "NoParameters",
    "Parameters",
    "Picker",
    "Pipeline",
    "Plugin",
    "PluginContext",
    "PluginSpec",
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
