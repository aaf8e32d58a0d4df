"""The search of one tier: enumerate (space), screen in steady state (screen), confirm the
cheapest in the simulator by branch and bound (bound), and tell the result (explain).

The steady-state floor is optimistic (screen.py), so a configuration the bound prunes could
not have been cheaper in the simulator; tests check the search against brute force.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tiergate.common.tiers import Tier
from tiergate.pools.engines import ENGINES
from tiergate.sim_nodes.catalogs import Catalog, CatalogError
from tiergate.sim_nodes.tier_rules import memory_problem

from .bound import Progress, branch_and_bound
from .confirm import Trial, run_trial
from .errors import PlanError
from .explain import met_verdict, runner_up, simulated, steady, unmet_verdict
from .report import PlanReport, SearchCounts, SimulatedWindow, TierPlan
from .screen import Screen, screen
from .space import Candidate, candidates
from .spec import PlanFile, SearchSpec, TierDemand
from .traffic import TierTraffic

__all__ = ["NO_PROGRESS", "plan_fleet", "plan_tier"]


class _Silent:
    def start(self, what: str, total: int) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass


NO_PROGRESS: Progress = _Silent()


def plan_fleet(
    plan: PlanFile,
    traffic: dict[Tier, TierTraffic],
    catalog: Catalog,
    progress: Progress = NO_PROGRESS,
) -> PlanReport:
    """Every tier of `plan`, planned independently (tiers share no replicas)."""
    tiers = [
        plan_tier(
            tier,
            demand,
            traffic[tier],
            plan.search,
            catalog,
            seed=plan.simulation.seed,
            fewest_requests=plan.simulation.requests,
            progress=progress,
        )
        for tier, demand in plan.tiers.items()
    ]
    cost = sum(t.plan.cost_per_hour_usd for t in tiers if t.plan is not None)
    return PlanReport(
        name=plan.name, met=all(t.met for t in tiers), cost_per_hour_usd=cost, tiers=tiers
    )


def plan_tier(
    tier: Tier,
    demand: TierDemand,
    traffic: TierTraffic,
    search: SearchSpec,
    catalog: Catalog,
    *,
    seed: int = 0,
    fewest_requests: int = 300,
    progress: Progress = NO_PROGRESS,
) -> TierPlan:
    """The cheapest fleet of one tier that meets its SLO in simulation, or the closest miss
    (each window at least `fewest_requests` requests)."""
    slo, shape = demand.slo, traffic.shape
    space = _space(tier, demand, traffic, search, catalog)
    progress.start(f"{tier}: steady state", len(space))
    screens = []
    for c in space:
        screens.append(screen(c, catalog, shape, slo, traffic.rate_per_s))
        progress.advance()
    feasible = sorted(
        (s for s in screens if s.verdict == "feasible"),
        # Equal floors: the one with the most headroom at its floor first.
        key=lambda s: (
            s.floor_cost_per_hour_usd,
            traffic.rate_per_s / (s.floor_replicas * s.capacity_per_s),
            str(s.candidate),
        ),
    )
    per_h = traffic.rate_per_s * shape.output_tokens * 3600.0  # output tokens an hour

    def trial_of(s: Screen) -> Callable[[int], Trial]:
        return lambda n: run_trial(s, traffic, slo, n, seed=seed, fewest_requests=fewest_requests)

    progress.start(f"{tier}: simulator", len(feasible))
    found = branch_and_bound(feasible, trial_of, search.max_replicas, progress)
    counts = SearchCounts(
        configurations=len(space),
        unfit=sum(s.verdict == "unfit" for s in screens),
        too_slow=sum(s.verdict == "too-slow" for s in screens),
        pruned_by_cost=len(found.pruned),
        simulated=found.simulated,
        simulations=found.simulations,
    )
    common: dict[str, Any] = {
        "tier": tier,
        "model": demand.model,
        "engine": demand.engine,
        "rate_per_s": traffic.rate_per_s,
        "mean_prompt_tokens": shape.input_tokens,
        "mean_cached_prompt_tokens": shape.cached_input_tokens,
        "mean_output_tokens": shape.output_tokens,
        "slo_percentile": slo.percentile,
        "slo_ttft_ms": slo.ttft_ms,
        "slo_tpot_ms": slo.tpot_ms,
    }
    if found.met:
        best = found.best()
        plan = simulated(*best, per_h)
        runner = runner_up(found, best, per_h)
        return TierPlan(
            **common,
            **_window(best[1]),
            met=True,
            plan=plan,
            closest=None,
            runner_up=runner[0] if runner else None,
            runner_up_lost_because=runner[1] if runner else None,
            verdict=met_verdict(tier, plan),
            search=counts,
        )
    closest, closest_trial = None, None
    if found.misses:
        s, t, _ = max(found.misses, key=lambda m: (m[1].attainment, -m[1].cost_per_hour_usd))
        closest, closest_trial = simulated(s, t, per_h), t
    elif found.beyond:
        # Every configuration that could meet the SLO needs more replicas than allowed.
        closest = steady(min(found.beyond, key=lambda s: s.floor_cost_per_hour_usd), per_h)
    else:
        slow = [s for s in screens if s.verdict == "too-slow"]
        if slow:
            # Nothing got to the simulator: show the least slow at batch 1, at the replicas
            # its batch-1 throughput needs for the traffic.
            s = min(slow, key=lambda s: (s.slowness, s.cost_per_replica_hour_usd))
            assert s.alone is not None
            per_replica = s.alone.throughput_output_tokens_per_s / shape.output_tokens
            n = min(search.max_replicas, max(1, math.ceil(traffic.rate_per_s / per_replica)))
            counts = counts.model_copy(
                update={"simulated": counts.simulated + 1, "simulations": counts.simulations + 1}
            )
            closest_trial = trial_of(s)(n)
            closest = simulated(s, closest_trial, per_h)
    return TierPlan(
        **common,
        **_window(closest_trial),
        met=False,
        plan=None,
        closest=closest,
        runner_up=None,
        runner_up_lost_because=None,
        verdict=unmet_verdict(tier, demand, closest, search.max_replicas),
        search=counts,
    )


def _window(t: Trial | None) -> dict[str, Any]:
    """The report's fields about the window of trial `t` (the plan's or the closest)."""
    w = t.window if t is not None else None
    if w is None:
        return {"requests_simulated": 0, "window": None}
    summary = SimulatedWindow(
        requests=len(w.requests),
        measured_requests=w.measured,
        replicas_simulated=w.replicas,
        fleet_replicas=w.fleet_replicas,
        arrivals_span_s=w.span_s,
        request_lifetime_s=w.lifetime_s,
        lifetimes=w.lifetimes,
        cut_by_budget=w.cut,
    )
    return {"requests_simulated": len(w.requests), "window": summary}


def _space(
    tier: Tier, demand: TierDemand, traffic: TierTraffic, search: SearchSpec, catalog: Catalog
) -> list[Candidate]:
    """The tier's configurations; PlanError when the model, the search or the traffic cannot
    be planned at all."""
    try:
        model = catalog.model(demand.model)
        space = list(
            candidates(
                tier,
                demand,
                search,
                catalog,
                tokens_per_request=traffic.shape.tokens_per_sequence,
                longest_request=traffic.longest_tokens,
            )
        )
    except CatalogError as exc:
        raise PlanError(f"tiers.{tier}: {exc}") from None
    if traffic.longest_tokens > model.max_context_tokens:
        raise PlanError(
            f"tiers.{tier}: a request of {traffic.longest_tokens} tokens exceeds the "
            f"{model.max_context_tokens}-token context of {model.name}"
        )
    if not space:
        why = _why_none(tier, demand, catalog, traffic.longest_tokens)
        raise PlanError(f"tiers.{tier}: no configuration in the search: {why}")
    return space


def _why_none(tier: Tier, demand: TierDemand, catalog: Catalog, longest_tokens: int) -> str:
    """Why a tier's search space is empty, in words."""
    problem = memory_problem(tier, catalog)
    if problem is not None:
        return problem
    held = f"{demand.model} with a request of {longest_tokens} tokens"
    if ENGINES[demand.engine].one_node:
        return (
            f"engine {demand.engine} runs a replica on one system of its accelerator, and no "
            f"accelerator and weightDtype of the search holds {held} on one system: search "
            "accelerators with more memory or smaller weights, or plan it with engine sim"
        )
    return f"no accelerator and weightDtype of the search holds {held}"
