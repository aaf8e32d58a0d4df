"""The steady-state prune: what a configuration can never do, and the fewest replicas it
could possibly need.

A replica meets the SLO in steady state up to some concurrency (TTFT and TPOT both grow with
the batch); its capacity is the request rate it completes there. Traffic at `rate` needs at
least rate / capacity replicas: the steady state is closed-loop and reports means, while the
SLO is a percentile of Poisson traffic, so the simulator can only ask for more. That floor
orders the search and bounds it (search.py). A configuration too slow at batch 1 never meets
the SLO at any replica count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf import (
    Deployment,
    PerfResult,
    Workload,
    build_deployment,
    evaluate,
    max_running,
)

from .space import Candidate
from .spec import SloTarget

__all__ = ["Screen", "Verdict", "screen"]

Verdict = Literal["unfit", "too-slow", "feasible"]


@dataclass(frozen=True, slots=True)
class Screen:
    """What the steady-state model says about one configuration for one tier's traffic."""

    candidate: Candidate
    deployment: Deployment
    verdict: Verdict
    reason: str
    #: At batch 1 (None when unfit): the best latencies the configuration can ever give.
    alone: PerfResult | None = None
    #: Largest concurrency at which steady-state TTFT and TPOT meet the SLO (0: none).
    slo_concurrency: int = 0
    #: Requests per second one replica completes at that concurrency.
    capacity_per_s: float = 0.0
    floor_replicas: int = 0
    #: The steady state at `slo_concurrency`.
    at_capacity: PerfResult | None = None
    #: How far batch 1 is from the SLO (<= 1: within it); infinite when unfit.
    slowness: float = math.inf

    @property
    def cost_per_replica_hour_usd(self) -> float:
        return self.deployment.cost_per_hour_usd

    @property
    def floor_cost_per_hour_usd(self) -> float:
        return self.floor_replicas * self.cost_per_replica_hour_usd


def screen(
    candidate: Candidate, catalog: Catalog, shape: Workload, slo: SloTarget, rate_per_s: float
) -> Screen:
    """Screen `candidate` for traffic of mean `shape` at `rate_per_s` under `slo`."""
    spec = candidate.serving_spec()
    d = build_deployment(spec, catalog)
    batching = spec.batching.to_batching()
    alone = evaluate(d, _at(shape, 1), batching)
    if not alone.fits:
        return Screen(candidate, d, "unfit", alone.reason or "does not fit")
    slowness = max(alone.ttft_s / slo.ttft_s, alone.tpot_s / slo.tpot_s)

    def meets(c: int) -> PerfResult | None:
        r = alone if c == 1 else evaluate(d, _at(shape, c), batching)
        return r if r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tpot_s else None

    if meets(1) is None:
        what = []
        if alone.ttft_s > slo.ttft_s:
            what.append(f"TTFT {alone.ttft_s * 1000:.1f} ms > {slo.ttft_ms:g} ms")
        if alone.tpot_s > slo.tpot_s:
            what.append(f"TPOT {alone.tpot_s * 1000:.2f} ms > {slo.tpot_ms:g} ms")
        reason = "too slow even at batch 1: " + ", ".join(what)
        return Screen(candidate, d, "too-slow", reason, alone, slowness=slowness)
    # TTFT and TPOT grow with the batch: bisect for the largest concurrency that meets both.
    low, high = 1, max_running(d, _at(shape, None), batching)
    best = alone
    while low < high:
        mid = (low + high + 1) // 2
        found = meets(mid)
        if found is None:
            high = mid - 1
        else:
            low, best = mid, found
    capacity = best.throughput_output_tokens_per_s / shape.output_tokens
    floor = max(1, math.ceil(rate_per_s / capacity - 1e-9))
    reason = f"meets the SLO in steady state up to {low} streams ({capacity:.3g} req/s each)"
    return Screen(candidate, d, "feasible", reason, alone, low, capacity, floor, best, slowness)


def _at(shape: Workload, concurrency: int | None) -> Workload:
    return Workload(shape.input_tokens, shape.output_tokens, shape.cached_input_tokens, concurrency)
