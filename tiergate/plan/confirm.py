"""Confirming a configuration in the virtual-time simulator: percentiles, not means.

A trial replays a window of the tier's requests (window.py) through `replicas` replicas. A
measured request attains the SLO when both its TTFT and its TPOT are within the targets (a
rejected request never does); the fleet meets the SLO when the attained share reaches the
target percentile and it has at least the steady-state floor of replicas: below the floor the
replicas cannot keep up with the rate, however a finite window looks. The fewest replicas are
found by stepping up from the floor (doubling the step), then bisecting, so the answer is
tight: it meets, and one replica fewer misses or is below the floor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tiergate.sim_nodes.engine.simulation import SimulationReport, simulate

from .screen import Screen
from .spec import SloTarget
from .traffic import TierTraffic
from .window import Window, window

__all__ = ["Trial", "fewest_replicas", "run_trial"]

#: Attainment is a ratio of counts; this absorbs the float rounding of goodput / rate.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Trial:
    """One simulation of a configuration at a replica count (`report` is of the replicas
    simulated: the fleet, or a slice of it)."""

    replicas: int
    report: SimulationReport
    attainment: float
    meets: bool
    cost_per_hour_usd: float
    window: Window | None = None


def run_trial(
    screened: Screen,
    traffic: TierTraffic,
    slo: SloTarget,
    replicas: int,
    *,
    seed: int,
    fewest_requests: int,
) -> Trial:
    """Simulate a window of `traffic` on `replicas` replicas of the screened configuration
    (at least `fewest_requests` requests, the plan's `simulation.requests`)."""
    w = window(traffic, screened, replicas, fewest_requests)
    report = simulate_window(screened, w, slo, seed=seed)
    attained = attainment(report)
    meets = attained + _EPSILON >= slo.attainment and replicas >= screened.floor_replicas
    cost = replicas * screened.cost_per_replica_hour_usd
    return Trial(replicas, report, attained, meets, cost, w)


def simulate_window(screened: Screen, w: Window, slo: SloTarget, *, seed: int) -> SimulationReport:
    """The simulator's report of window `w` on the screened configuration."""
    return simulate(
        screened.deployment,
        screened.candidate.serving_spec().batching.to_batching(),
        w.requests,
        replicas=w.replicas,
        slo_ttft_s=slo.ttft_s,
        slo_tpot_s=slo.tpot_s,
        seed=seed,
        measured_s=w.measured_s,
    )


def attainment(report: SimulationReport) -> float:
    """The share of measured requests that completed within both targets."""
    if not (report.completed and report.requests_per_s > 0):
        return 0.0
    # goodput / throughput is the share of completed requests that met both targets.
    share = report.goodput_requests_per_s / report.requests_per_s
    return share * report.completed / report.requests


def fewest_replicas(
    trial: Callable[[int], Trial], floor: int, limit: int
) -> tuple[Trial | None, list[Trial]]:
    """The trial at the fewest replicas in `floor`..`limit` that meets the SLO (None if even
    `limit` misses, or the floor is above it: then `limit` is tried, the closest), and every
    trial run (in order)."""
    runs: dict[int, Trial] = {}

    def at(n: int) -> Trial:
        if n not in runs:
            runs[n] = trial(n)
        return runs[n]

    start = max(floor, 1)
    if start > limit:
        at(limit)
        return None, list(runs.values())
    if at(start).meets:
        return runs[start], list(runs.values())
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
