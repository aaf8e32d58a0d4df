"""The search: on tiny fixed spaces it picks what brute force picks, the cheapest fleet that
meets the SLO in the simulator, and that fleet is tight (one replica fewer misses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plan_helpers import parsed, screened, tiny_plan

from tiergate.plan import plan_fleet, plan_traffic
from tiergate.plan.confirm import Trial, fewest_replicas, run_trial
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.engine.simulation import SimulationReport

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

SCENARIOS = {
    "tight-tpot": {},
    "loose": {"ratePerS": 120, "slo": {"percentile": 90, "ttftMs": 1000, "tpotMs": 30}},
    "p99-ttft": {"ratePerS": 40, "slo": {"percentile": 99, "ttftMs": 120, "tpotMs": 20}},
}


def brute_force(data: dict[str, Any]) -> tuple[float, set[tuple[str, int]]]:
    """The cheapest $/h over every configuration at every replica count that meets the SLO
    in simulation, and every (configuration, replicas) at that cost."""
    plan = parsed(data)
    traffic = plan_traffic(plan, Path("."))["batched"]
    demand = plan.tiers["batched"]
    met: list[tuple[float, str, int]] = []
    for s in screened(plan):
        if s.verdict == "unfit":
            continue
        c = s.candidate
        # Below its steady-state floor a fleet never meets the SLO (confirm.py).
        for n in range(max(1, s.floor_replicas), plan.search.max_replicas + 1):
            t = run_trial(
                s,
                traffic,
                demand.slo,
                n,
                seed=plan.simulation.seed,
                fewest_requests=plan.simulation.requests,
            )
            if t.meets:
                met.append((t.cost_per_hour_usd, str(c), n))
                break
    cheapest = min(cost for cost, _, _ in met)
    return cheapest, {(c, n) for cost, c, n in met if cost == pytest.approx(cheapest)}


@pytest.mark.parametrize("changes", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_the_search_agrees_with_brute_force(changes: dict[str, Any]) -> None:
    data = tiny_plan(**changes)
    cheapest, winners = brute_force(data)
    plan = parsed(data)
    report = plan_fleet(plan, plan_traffic(plan, Path(".")), default_catalog())
    tier = report.tiers[0]
    assert tier.met and tier.plan is not None
    assert tier.plan.cost_per_hour_usd == pytest.approx(cheapest)
    assert (tier.plan.configuration.summary, tier.plan.replicas) in winners
    # The prune did its job: not everything went through the simulator.
    assert tier.search.simulated < tier.search.configurations


def test_the_plan_meets_the_slo_in_simulation_and_one_replica_fewer_misses() -> None:
    data = tiny_plan(ratePerS=200)
    data["simulation"]["requests"] = 2000
    plan = parsed(data)
    traffic = plan_traffic(plan, Path("."))["batched"]
    tier = plan_fleet(plan, {"batched": traffic}, default_catalog()).tiers[0]
    assert tier.plan is not None and tier.plan.replicas > 1
    summary = tier.plan.configuration.summary
    chosen = next(s for s in screened(plan) if str(s.candidate) == summary)
    slo = plan.tiers["batched"].slo
    at_plan, fewer = (
        run_trial(chosen, traffic, slo, n, seed=3, fewest_requests=2000)
        for n in (tier.plan.replicas, tier.plan.replicas - 1)
    )
    assert at_plan.meets and at_plan.attainment >= slo.attainment
    assert not fewer.meets
    assert tier.plan.slo_attainment == pytest.approx(at_plan.attainment)


def test_a_runner_up_is_named_with_why_it_lost() -> None:
    plan = parsed(tiny_plan())
    tier = plan_fleet(plan, plan_traffic(plan, Path(".")), default_catalog()).tiers[0]
    assert tier.runner_up is not None and tier.runner_up_lost_because
    assert tier.plan is not None
    assert tier.runner_up.configuration.accelerator != tier.plan.configuration.accelerator
    assert tier.runner_up.cost_per_hour_usd >= tier.plan.cost_per_hour_usd


def _fake(threshold: int, calls: list[int]) -> Any:
    report = SimulationReport.model_construct()

    def trial(n: int) -> Trial:
        calls.append(n)
        return Trial(n, report, 1.0 if n >= threshold else 0.5, n >= threshold, float(n))

    return trial


@pytest.mark.parametrize("floor", [1, 3, 6])
def test_fewest_replicas_is_tight_from_any_floor_below_it(floor: int) -> None:
    calls: list[int] = []
    found, runs = fewest_replicas(_fake(7, calls), floor, limit=40)
    assert found is not None and found.replicas == 7
    assert 6 in calls  # one fewer was tried, and missed
    assert len(runs) == len(set(calls))


@pytest.mark.parametrize("floor", [7, 9, 20])
def test_fewest_replicas_never_goes_below_the_floor(floor: int) -> None:
    calls: list[int] = []
    found, _ = fewest_replicas(_fake(7, calls), floor, limit=40)
    assert found is not None and found.replicas == floor
    assert calls == [floor]


def test_a_floor_above_the_limit_meets_nothing_but_tries_the_limit() -> None:
    calls: list[int] = []
    found, runs = fewest_replicas(_fake(1, calls), 50, limit=10)
    assert found is None and calls == [10] and len(runs) == 1


def test_fewest_replicas_gives_up_at_the_limit() -> None:
    calls: list[int] = []
    found, runs = fewest_replicas(_fake(50, calls), 2, limit=10)
    assert found is None
    assert max(calls) == 10 and all(not t.meets for t in runs)
