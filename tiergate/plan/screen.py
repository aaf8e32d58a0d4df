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
    slo_capacity,
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
    found = slo_capacity(d, shape, spec.batching.to_batching(), slo.ttft_s, slo.tpot_s)
    alone = found.alone
    if not alone.fits:
        return Screen(candidate, d, "unfit", alone.reason or "does not fit")
    slowness = max(alone.ttft_s / slo.ttft_s, alone.tpot_s / slo.tpot_s)
    if found.at_capacity is None:
        what = []
        if alone.ttft_s > slo.ttft_s:
            what.append(f"TTFT {alone.ttft_s * 1000:.1f} ms > {slo.ttft_ms:g} ms")
        if alone.tpot_s > slo.tpot_s:
            what.append(f"TPOT {alone.tpot_s * 1000:.2f} ms > {slo.tpot_ms:g} ms")
        reason = "too slow even at batch 1: " + ", ".join(what)
        return Screen(candidate, d, "too-slow", reason, alone, slowness=slowness)
    low, best, capacity = found.concurrency, found.at_capacity, found.requests_per_s
    floor = max(1, math.ceil(rate_per_s / capacity - 1e-9))
    reason = f"meets the SLO in steady state up to {low} streams ({capacity:.3g} req/s each)"
    return Screen(candidate, d, "feasible", reason, alone, low, capacity, floor, best, slowness)
