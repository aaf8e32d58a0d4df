"""The simulated window: the requests one trial replays, on how many replicas, and which of
them it measures.

A trial starts from idle replicas, so its arrivals must span several request lifetimes for
the simulator to see a steady load rather than a burst. A request's lifetime is the
configuration's own, in steady state at its SLO concurrency (TTFT + (output - 1) x TPOT).
Arrivals span `LIFETIMES` of them: the first lifetime warms the fleet up and the last keeps
it loaded while the measured requests finish, so only arrivals in between are measured.

A fleet of more than a few replicas is simulated as a slice of them given its share of the
traffic (the tier's arrivals, slowed by fleet / slice): a least-loaded router spreads Poisson
arrivals evenly, and a slice pools fewer replicas than the fleet, so it can only ask for more.
The window's size then follows the configuration, not the rate. A budget of simulator steps
bounds it (a replica steps at least once per output token it decodes); when the budget binds,
the window spans fewer lifetimes and the plan says so. A trace is replayed as recorded, on
the whole fleet, up to the same budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tiergate.sim_nodes.engine.workload import WorkloadRequest

from .screen import Screen
from .spec import MAX_WINDOW_REQUESTS
from .traffic import TierTraffic

__all__ = ["LIFETIMES", "SLICE_REPLICAS", "STEP_BUDGET", "Window", "window"]

#: Request lifetimes a window's arrivals span: one to warm up, one to cool down, the rest
#: measured.
LIFETIMES = 12
#: The most replicas a trial simulates; a larger fleet is simulated as a slice this size.
SLICE_REPLICAS = 8
#: Simulator steps a window may take, about (~20 us each: a few seconds).
STEP_BUDGET = 250_000


@dataclass(frozen=True, slots=True)
class Window:
    """The requests a trial replays (sorted by arrival) and the arrivals it measures."""

    requests: tuple[WorkloadRequest, ...]
    #: Replicas simulated: the fleet, or a slice of it given its share of the traffic.
    replicas: int
    fleet_replicas: int
    #: A request's steady-state lifetime on this configuration, seconds.
    lifetime_s: float
    #: Arrivals within these times (inclusive) are measured.
    measured_s: tuple[float, float]
    measured: int
    #: Whether the step budget cut the window short of `LIFETIMES` lifetimes.
    cut: bool

    @property
    def span_s(self) -> float:
        """First arrival to last."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def lifetimes(self) -> float:
        """Request lifetimes the arrivals span."""
        return self.span_s / self.lifetime_s


def window(traffic: TierTraffic, screened: Screen, replicas: int, fewest: int) -> Window:
    """The window of a trial of `screened` at `replicas` replicas: at least `fewest` requests
    (the plan's `simulation.requests`) when the budget allows."""
    lifetime = _lifetime_s(traffic, screened)
    shape = traffic.shape
    prefill_steps = math.ceil(
        (shape.input_tokens - shape.cached_input_tokens) / screened.candidate.max_batched_tokens
    )
    steps_per_request = shape.output_tokens + prefill_steps
    if traffic.poisson:
        # Slice fewer replicas for long outputs, so the window still spans its lifetimes.
        affordable = STEP_BUDGET // (LIFETIMES * steps_per_request)
        simulated = max(1, min(replicas, SLICE_REPLICAS, affordable))
    else:
        simulated = replicas
    stretch = replicas / simulated  # the slice's arrivals are the tier's, slowed
    rate = traffic.rate_per_s / stretch
    wanted = max(math.ceil(rate * LIFETIMES * lifetime), fewest)
    # Little's law: requests in flight on a replica, whose steps they share (at most a batch).
    batch = screened.candidate.max_num_seqs
    in_flight = max(1.0, min(traffic.rate_per_s / replicas * lifetime, batch))
    budget = min(
        MAX_WINDOW_REQUESTS,
        len(traffic.requests),
        max(2, math.floor(STEP_BUDGET * in_flight / steps_per_request)),
    )
    n = max(2, min(wanted, budget))
    requests = traffic.requests[:n]
    if stretch != 1.0:
        requests = tuple(
            WorkloadRequest(
                r.arrival_s * stretch, r.prompt_tokens, r.output_tokens, r.cached_prompt_tokens
            )
            for r in requests
        )
    first, last = requests[0].arrival_s, requests[-1].arrival_s
    edge = min(lifetime, (last - first) / LIFETIMES)
    measured_s = (first + edge, last - edge)
    measured = sum(measured_s[0] <= r.arrival_s <= measured_s[1] for r in requests)
    if measured == 0:  # a few requests far apart: measure them all
        measured_s, measured = (first, last), len(requests)
    return Window(requests, simulated, replicas, lifetime, measured_s, measured, cut=n < wanted)


def _lifetime_s(traffic: TierTraffic, screened: Screen) -> float:
    """The mean request's life on `screened` in steady state (at its SLO concurrency, or
    alone when it meets the SLO at none)."""
    steady = screened.at_capacity or screened.alone
    output = traffic.shape.output_tokens
    if steady is None:  # unfit configurations are never simulated
        return 1.0
    return max(steady.ttft_s + (output - 1) * steady.tpot_s, 1e-6)
