"""Benchmark: `tiergate plan` on the seed workload over the whole shipped catalog, on one core.

Plans examples/plan/seed.yaml (every accelerator, chip count, layout, dtype pair, batch cap
and the speculative option it allows) several times and prints each round's wall time, the
median (target: under 60 s), how many configurations the steady-state prune kept out of the
simulator, and per tier the plan with its SLO attainment at the planned replicas and at one
fewer (the planner validation, on the plan's window). Not a test: the target is printed next
to the figure.

    .venv/bin/python benchmarks/plan_search.py [--rounds 3] [--plan examples/plan/seed.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from tiergate.common.tiers import Tier
from tiergate.plan import (
    PlanFile,
    PlanReport,
    TierPlan,
    TierTraffic,
    load_plan,
    plan_fleet,
    plan_traffic,
    pool_manifest,
)
from tiergate.plan.confirm import attainment
from tiergate.plan.screen import screen
from tiergate.plan.space import Candidate
from tiergate.plan.window import window
from tiergate.pools import InferencePool
from tiergate.sim_nodes.catalogs import Catalog, default_catalog
from tiergate.sim_nodes.engine.simulation import simulate
from tiergate.sim_nodes.perf import build_deployment

TARGET_WALL_S = 60.0
SEED_PLAN = Path(__file__).resolve().parents[1] / "examples" / "plan" / "seed.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan", type=Path, default=SEED_PLAN)
    args = parser.parse_args()

    pinned = "no"
    if hasattr(os, "sched_setaffinity"):
        # One core, so the figure does not depend on how busy the machine's other cores are.
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        pinned = f"core {core}"

    plan, base = load_plan(args.plan)
    catalog = default_catalog()
    print(f"plan {args.plan.name}: {', '.join(plan.tiers)}; pinned to {pinned}")
    walls: list[float] = []
    cpus: list[float] = []
    report: PlanReport | None = None
    for i in range(args.rounds):
        start, cpu = time.perf_counter(), time.process_time()
        report = plan_fleet(plan, plan_traffic(plan, base), catalog)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        print(f"round {i + 1}: {walls[-1]:.2f} s ({cpus[-1]:.2f} s CPU)")
    assert report is not None
    traffic = plan_traffic(plan, base)
    median = statistics.median(walls)
    verdict = "within" if median < TARGET_WALL_S else "OVER"
    print(
        f"median {median:.2f} s, min {min(walls):.2f} s ({verdict} the {TARGET_WALL_S:g} s "
        f"target); CPU median {statistics.median(cpus):.2f} s"
    )
    print()
    total = simulated = runs = 0
    for t in report.tiers:
        s = t.search
        total, simulated, runs = (
            total + s.configurations,
            simulated + s.simulated,
            runs + s.simulations,
        )
        print(
            f"{t.tier}: {s.configurations} configurations; {s.unfit} unfit, {s.too_slow} too slow "
            f"at batch 1, {s.pruned_by_cost} pruned on cost; {s.simulated} simulated in "
            f"{s.simulations} runs; window {t.requests_simulated} requests"
        )
        print(f"  {t.verdict}")
        if t.plan is not None:
            at_plan = _attained(plan, t, traffic, catalog, t.plan.replicas)
            fewer = _attained(plan, t, traffic, catalog, t.plan.replicas - 1)
            print(
                f"  validation: {at_plan} within the SLO at {t.plan.replicas} replicas (the "
                f"emitted pool), {fewer} at {t.plan.replicas - 1} (target {t.slo_percentile:g}%)"
            )
    print()
    print(
        f"all tiers: {total} configurations, {simulated} simulated ({runs} simulator runs): the "
        f"prune avoided simulating {total - simulated} ({(total - simulated) / total:.1%})"
    )
    print(f"fleet: ${report.cost_per_hour_usd:,.2f}/h")


def _attained(
    plan: PlanFile, tier: TierPlan, traffic: dict[Tier, TierTraffic], catalog: Catalog, n: int
) -> str:
    """Whether `n` replicas of the tier's emitted pool meet the SLO on the plan's window at
    that count: the share of measured requests within it, or why not."""
    if n < 1:
        return "no replicas"
    spec = InferencePool.model_validate(pool_manifest(plan.name, tier)).spec
    slo = plan.tiers[spec.tier].slo
    assert tier.plan is not None
    chosen = screen(
        Candidate.of(tier.plan.configuration),
        catalog,
        traffic[spec.tier].shape,
        slo,
        traffic[spec.tier].rate_per_s,
    )
    if n < chosen.floor_replicas:
        return f"below the steady-state floor of {chosen.floor_replicas}"
    w = window(traffic[spec.tier], chosen, n, plan.simulation.requests)
    r = simulate(
        build_deployment(spec, catalog),
        spec.batching.to_batching(),
        w.requests,
        replicas=w.replicas,
        slo_ttft_s=slo.ttft_s,
        slo_tpot_s=slo.tpot_s,
        seed=plan.simulation.seed,
        measured_s=w.measured_s,
    )
    return f"{attainment(r):.1%}"


if __name__ == "__main__":
    main()
