"""The plan holds at production rates: on one fixed configuration, ten times the rate plans
about ten times the replicas (never fewer than the steady-state floor), and the planned fleet,
simulated whole over a long steady window of fresh arrivals, meets the SLO."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from plan_helpers import parsed, plan_cli, screened, write_plan

from tiergate.plan import PlanFile, TierPlan, plan_fleet, plan_traffic
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.engine.simulation import simulate
from tiergate.sim_nodes.engine.workload import parse_length, poisson_workload

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

SLO = {"percentile": 90, "ttftMs": 500, "tpotMs": 30}
#: Request lifetimes the steady check's arrivals span; the first and last are not measured.
STEADY_LIFETIMES = 6


def fixed_space(rate_per_s: float) -> dict[str, Any]:
    """llama-3.1-8b on one H100, fp8, batch cap 64: a single configuration."""
    return {
        "name": "fixed",
        "tiers": {
            "batched": {
                "model": "llama-3.1-8b",
                "ratePerS": rate_per_s,
                "promptTokens": "1024",
                "outputTokens": "256",
                "slo": SLO,
            }
        },
        "search": {
            "accelerators": ["h100-sxm"],
            "weightDtypes": ["fp8"],
            "kvDtypes": ["fp8"],
            "batchCaps": [64],
            "maxChipMultiple": 1,
            "maxReplicas": 1024,
        },
    }


def planned(plan: PlanFile) -> TierPlan:
    tier = plan_fleet(plan, plan_traffic(plan, Path(".")), default_catalog()).tiers[0]
    assert tier.met and tier.plan is not None, tier.verdict
    return tier


def test_ten_times_the_rate_plans_at_least_eight_times_the_replicas() -> None:
    low, high = (planned(parsed(fixed_space(rate))) for rate in (200, 2000))
    assert low.plan is not None and high.plan is not None
    assert high.plan.replicas >= 8 * low.plan.replicas, (low.plan.replicas, high.plan.replicas)
    for tier in (low, high):
        assert tier.plan is not None and tier.plan.steady_state_floor_replicas is not None
        assert tier.plan.replicas >= tier.plan.steady_state_floor_replicas
        # The plan says how its window was sized, and it spans the request lifetimes.
        assert tier.window is not None and tier.window.lifetimes >= 3.5
        assert not tier.window.cut_by_budget


@pytest.mark.parametrize("rate_per_s", [200, 2000])
def test_the_planned_fleet_meets_the_slo_over_a_steady_window(rate_per_s: float) -> None:
    plan = parsed(fixed_space(rate_per_s))
    tier = planned(plan)
    assert tier.plan is not None
    [chosen] = screened(plan)
    demand = plan.tiers["batched"]
    assert tier.window is not None
    lifetime_s = tier.window.request_lifetime_s
    span_s = STEADY_LIFETIMES * lifetime_s
    requests = poisson_workload(
        round(rate_per_s * span_s),
        rate_per_s,
        parse_length(demand.prompt_tokens),
        parse_length(demand.output_tokens),
        random.Random("a steady window the planner never saw"),
    )
    report = simulate(
        chosen.deployment,
        chosen.candidate.serving_spec().batching.to_batching(),
        requests,
        replicas=tier.plan.replicas,
        slo_ttft_s=demand.slo.ttft_s,
        slo_tpot_s=demand.slo.tpot_s,
        measured_s=(lifetime_s, span_s - lifetime_s),
    )
    assert report.requests > rate_per_s * lifetime_s  # several lifetimes were measured
    attained = report.goodput_requests_per_s / report.requests_per_s * report.completed
    assert attained / report.requests >= demand.slo.attainment


def test_a_rate_no_fleet_within_max_replicas_can_serve_is_unmet_not_one_replica(
    tmp_path: Path,
) -> None:
    data = fixed_space(1_000_000)
    data["search"]["maxReplicas"] = 64
    done = plan_cli(write_plan(tmp_path, data))
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1
    assert "steady-state floor of" in done.stderr and "search.maxReplicas (64)" in done.stderr
