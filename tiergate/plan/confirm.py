"""Confirming a configuration in the virtual-time simulator: percentiles, not means.

A trial replays the tier's requests through `replicas` replicas. A request attains the SLO
when both its TTFT and its TPOT are within the targets (a rejected request never does); the
fleet meets the SLO when the attained share reaches the target percentile. The fewest
replicas are found by stepping up from the steady-state floor (doubling the step), then
bisecting, so the answer is tight: it meets, one replica fewer does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tiergate.sim_nodes.engine.simulation import SimulationReport, simulate
from tiergate.sim_nodes.engine.workload import WorkloadRequest

from .screen import Screen
from .spec import SloTarget

__all__ = ["Trial", "fewest_replicas", "run_trial"]

#: Attainment is a ratio of counts; this absorbs the float rounding of goodput / rate.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Trial:
    """One simulation of a configuration at a replica count."""

    replicas: int
    report: SimulationReport
    attainment: float
    meets: bool


def run_trial(
    screened: Screen,
    requests: Sequence[WorkloadRequest],
    slo: SloTarget,
    replicas: int,
    *,
    seed: int,
) -> Trial:
    """Simulate `requests` on `replicas` replicas of the screened configuration."""
    batching = screened.candidate.serving_spec().batching.to_batching()
    report = simulate(
        screened.deployment,
        batching,
        requests,
        replicas=replicas,
        slo_ttft_s=slo.ttft_s,
        slo_tpot_s=slo.tpot_s,
        seed=seed,
    )
    attained = 0.0
    if report.completed and report.requests_per_s > 0:
        # goodput / throughput is the share of completed requests that met both targets.
        share = report.goodput_requests_per_s / report.requests_per_s
        attained = share * report.completed / report.requests
    return Trial(replicas, report, attained, attained + _EPSILON >= slo.attainment)


def fewest_replicas(
    trial: Callable[[int], Trial], start: int, limit: int
) -> tuple[Trial | None, list[Trial]]:
    """The trial at the fewest replicas in 1..`limit` that meets the SLO (None if even
    `limit` misses), searching from `start`, and every trial run (in order)."""
    runs: dict[int, Trial] = {}

    def at(n: int) -> Trial:
        if n not in runs:
            runs[n] = trial(n)
        return runs[n]

    start = min(max(start, 1), limit)
    if at(start).meets:
        n = start
        while n > 1 and at(n - 1).meets:
            n -= 1
        return runs[n], list(runs.values())
    low, step = start, 1  # low misses
    while True:
        high = min(low + step, limit)
        if high <= low:
            return None, list(runs.values())
        if at(high).meets:
            break
        low, step = high, step * 2
    while high - low > 1:
        mid = (low + high) // 2
        if at(mid).meets:
            high = mid
        else:
            low = mid
    return runs[high], list(runs.values())
