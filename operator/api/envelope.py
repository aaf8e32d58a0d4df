"""A pool's performance envelope: what the performance model predicts for one replica.

Shared by the operator (it writes the envelope into the InferencePool's status) and the router
(it prices and predicts with the same numbers), so both always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf import (
    Deployment,
    PerfResult,
    ServingSpec,
    Workload,
    build_deployment,
    evaluate,
    max_running,
)

from .inference_pool import Envelope, ReferenceWorkload

__all__ = ["PoolPerformance", "predict"]


@dataclass(frozen=True, slots=True)
class PoolPerformance:
    """One replica as the spec lays it out, and the model's prediction for it."""

    deployment: Deployment
    result: PerfResult  # `result.fits` False: the model or its KV cache does not fit

    def envelope(self) -> Envelope:
        r = self.result
        return Envelope(
            max_concurrency=r.max_concurrency,
            tokens_per_second_per_stream=round(r.output_tokens_per_s_per_stream, 2),
            throughput_tokens_per_second=round(r.throughput_output_tokens_per_s, 1),
            ttft_seconds=round(r.ttft_s, 4),
            cost_per_million_output_tokens_usd=round(r.cost_per_million_output_tokens_usd, 4),
            chips=r.chips,
        )


def predict(spec: ServingSpec, workload: ReferenceWorkload, catalog: Catalog) -> PoolPerformance:
    """The envelope: `spec`'s batch as full as its cap and KV cache allow, under `workload`.

    Raises CatalogError (unknown names) and PerfConfigError (impossible layouts).
    """
    w = workload
    shape = Workload(w.input_tokens, w.output_tokens, w.cached_input_tokens, None)
    kv_tokens = spec.batching.max_num_seqs * shape.tokens_per_sequence
    deployment = build_deployment(spec, catalog, kv_tokens=kv_tokens)
    batching = spec.batching.to_batching()
    running = max(max_running(deployment, shape, batching), 1)
    full = Workload(shape.input_tokens, shape.output_tokens, shape.cached_input_tokens, running)
    return PoolPerformance(deployment, evaluate(deployment, full, batching))
