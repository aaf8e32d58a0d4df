"""What one replica can carry at an SLO: the most concurrent streams at which steady-state
TTFT and TPOT both stay within their targets.

Shared by the planner (its steady-state prune) and the operator's autoscaler (replicas for
the observed load). Both latencies grow with the batch, so the largest such concurrency is
found by bisection between 1 and what the batch cap and KV cache allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .deployment import Deployment
from .steady_state import Batching, PerfResult, Workload, evaluate, max_running

__all__ = ["SloCapacity", "slo_capacity"]


@dataclass(frozen=True, slots=True)
class SloCapacity:
    """One replica's capacity at an SLO for one request shape."""

    #: The steady state at batch 1: the best latencies the replica can ever give (`fits`
    #: False: the model or one sequence's KV cache does not fit; nothing else is computed).
    alone: PerfResult
    #: Largest concurrency at which TTFT and TPOT meet their targets (0: not even batch 1).
    concurrency: int = 0
    #: The steady state at `concurrency` (None when it is 0).
    at_capacity: PerfResult | None = None

    @property
    def requests_per_s(self) -> float:
        """Requests one replica completes per second at `concurrency` (0 when none)."""
        r = self.at_capacity
        return r.throughput_output_tokens_per_s / r.output_tokens if r is not None else 0.0


def slo_capacity(
    d: Deployment,
    shape: Workload,
    batching: Batching,
    ttft_s: float | None,
    tpot_s: float | None,
) -> SloCapacity:
    """`d`'s capacity for requests of `shape` (its concurrency is ignored) under targets
    `ttft_s` and `tpot_s` (None: no target; both None: as many streams as fit)."""
    ttft_limit = math.inf if ttft_s is None else ttft_s
    tpot_limit = math.inf if tpot_s is None else tpot_s
    alone = evaluate(d, _at(shape, 1), batching)
    if not alone.fits:
        return SloCapacity(alone)

    def meets(c: int) -> PerfResult | None:
        r = alone if c == 1 else evaluate(d, _at(shape, c), batching)
        return r if r.ttft_s <= ttft_limit and r.tpot_s <= tpot_limit else None

    if meets(1) is None:
        return SloCapacity(alone)
    low, high = 1, max_running(d, _at(shape, None), batching)
    best = alone
    while low < high:
        mid = (low + high + 1) // 2
        found = meets(mid)
        if found is None:
            high = mid - 1
        else:
            low, best = mid, found
    return SloCapacity(alone, low, best)


def _at(shape: Workload, concurrency: int | None) -> Workload:
    return Workload(shape.input_tokens, shape.output_tokens, shape.cached_input_tokens, concurrency)
