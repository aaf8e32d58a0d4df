"""How the search's results are told: predictions, the runner-up and why it lost, verdicts."""

from __future__ import annotations

import math

from tiergate.common.tiers import Tier

from .bound import Found
from .confirm import Trial
from .report import Configuration, Prediction
from .screen import Screen
from .spec import TierDemand

__all__ = ["met_verdict", "runner_up", "simulated", "steady", "unmet_verdict"]


def simulated(s: Screen, t: Trial, out_tokens_per_h: float) -> Prediction:
    """A configuration as the simulator saw it at `t.replicas` replicas."""
    r = t.report
    return Prediction(
        configuration=_configuration(s),
        replicas=t.replicas,
        source="simulation",
        ttft_p50_s=r.ttft_p50_s,
        ttft_p90_s=r.ttft_p90_s,
        tpot_p50_s=r.tpot_p50_s,
        tpot_p90_s=r.tpot_p90_s,
        slo_attainment=t.attainment,
        meets_slo=t.meets,
        steady_state_floor_replicas=s.floor_replicas,
        cost_per_hour_usd=t.cost_per_hour_usd,
        cost_per_million_output_tokens_usd=t.cost_per_hour_usd / out_tokens_per_h * 1e6,
    )


def met_verdict(tier: Tier, plan: Prediction) -> str:
    attained = plan.slo_attainment or 0.0
    return (
        f"tier {tier}: {plan.replicas} x {plan.configuration.summary} meets the SLO "
        f"({attained:.1%} of requests) for ${plan.cost_per_hour_usd:,.2f}/h"
    )


def unmet_verdict(
    tier: Tier, demand: TierDemand, closest: Prediction | None, max_replicas: int
) -> str:
    head = f"tier {tier}: no configuration meets {demand.slo}"
    if closest is None:
        return f"{head}: {demand.model} fits on nothing in the search"
    ttft = closest.ttft_p90_s if closest.ttft_p90_s is not None else closest.ttft_p50_s
    tpot = closest.tpot_p90_s if closest.tpot_p90_s is not None else closest.tpot_p50_s
    attained = closest.slo_attainment or 0.0
    floor = closest.steady_state_floor_replicas
    if floor is not None and floor > max_replicas:
        return (
            f"{head}; closest: {closest.configuration.summary}, whose steady-state floor of "
            f"{floor} replicas is more than search.maxReplicas ({max_replicas})"
        )
    return (
        f"{head}; closest: {closest.replicas} x {closest.configuration.summary} with TTFT p90 "
        f"{ttft * 1000:.1f} ms, TPOT p90 {tpot * 1000:.2f} ms, {attained:.1%} of requests "
        f"within both"
    )


def _configuration(s: Screen) -> Configuration:
    c, d = s.candidate, s.deployment
    return Configuration(
        summary=str(c),
        model=c.model,
        accelerator=c.accelerator,
        chips=c.chips,
        tensor_parallel=c.tensor_parallel,
        pipeline_stages=d.pipeline_stages,
        weight_dtype=c.weight_dtype,
        kv_dtype=c.kv_dtype,
        max_num_seqs=c.max_num_seqs,
        max_batched_tokens=c.max_batched_tokens,
        draft_model=c.draft_model,
        speculative_tokens=c.speculative_tokens,
        acceptance_rate=c.acceptance_rate,
    )


def runner_up(
    found: Found,
    best: tuple[Screen, Trial],
    out_tokens_per_h: float,
) -> tuple[Prediction, str] | None:
    """The configuration that came closest to the plan (preferably on another accelerator),
    and why it lost. Candidates: (least it could cost, accelerator, its prediction and why)."""
    winner, won = best
    plan_cost = won.cost_per_hour_usd
    # (least it could cost, accelerator, configuration, its trial (None: never simulated), why)
    options: list[tuple[float, str, Screen, Trial | None, str]] = []
    for s, t in found.met:
        if s is not winner:
            cost = t.cost_per_hour_usd
            options.append((cost, s.candidate.accelerator, s, t, _dearer(t, plan_cost)))
    for s, t, capped in found.misses:
        floor = (t.replicas + 1) * s.cost_per_replica_hour_usd if capped else math.inf
        options.append((floor, s.candidate.accelerator, s, t, _missed(t, capped, plan_cost)))
    for s, bound in found.pruned:
        cost = s.floor_cost_per_hour_usd
        options.append((cost, s.candidate.accelerator, s, None, _pruned(s, bound)))
    for s in found.beyond:
        cost = s.floor_cost_per_hour_usd
        why = f"its steady-state floor, {_replicas(s.floor_replicas)}, is more than allowed"
        options.append((cost, s.candidate.accelerator, s, None, why))
    elsewhere = [o for o in options if o[1] != winner.candidate.accelerator] or options
    if not elsewhere:
        return None
    _, _, chosen, trial, why = min(elsewhere, key=lambda o: (o[0], o[3] is None))
    if trial is None:
        return steady(chosen, out_tokens_per_h), why
    return simulated(chosen, trial, out_tokens_per_h), why


def _dearer(t: Trial, plan_cost: float) -> str:
    cost = t.cost_per_hour_usd
    if cost <= plan_cost:
        return f"costs the same, ${cost:,.2f}/h, and attains less ({t.attainment:.1%})"
    return (
        f"needs {_replicas(t.replicas)} for ${cost:,.2f}/h, ${cost - plan_cost:,.2f}/h more "
        f"than the plan"
    )


def _missed(t: Trial, capped: bool, plan_cost: float) -> str:
    why = f"misses the SLO at {_replicas(t.replicas)} (attains {t.attainment:.1%})"
    if capped:
        return f"{why}; one more would cost at least the plan's ${plan_cost:,.2f}/h"
    return f"{why}, the most search.maxReplicas allows"


def _pruned(s: Screen, bound: float) -> str:
    cost = s.floor_cost_per_hour_usd
    return (
        f"its steady-state floor alone, {_replicas(s.floor_replicas)} at ${cost:,.2f}/h, costs "
        f"at least ${bound:,.2f}/h, so it was never simulated"
    )


def steady(s: Screen, out_tokens_per_h: float) -> Prediction:
    """A configuration never simulated: its steady state at its SLO concurrency, floor fleet."""
    cost = s.floor_cost_per_hour_usd
    steady = s.at_capacity
    assert steady is not None
    return Prediction(
        configuration=_configuration(s),
        replicas=s.floor_replicas,
        source="steady-state",
        ttft_p50_s=steady.ttft_s,
        ttft_p90_s=None,
        tpot_p50_s=steady.tpot_s,
        tpot_p90_s=None,
        slo_attainment=None,
        meets_slo=False,
        steady_state_floor_replicas=s.floor_replicas,
        cost_per_hour_usd=cost,
        cost_per_million_output_tokens_usd=cost / out_tokens_per_h * 1e6,
    )


def _replicas(n: int) -> str:
    return f"{n} replica{'' if n == 1 else 's'}"
