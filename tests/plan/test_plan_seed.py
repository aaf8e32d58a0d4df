"""Planner validation on the seed workload (examples/plan/seed.yaml, fewer requests): each
tier's emitted pool, simulated at the planned load, meets the SLO percentile, and one replica
fewer misses it. The full-size run is benchmarks/plan_search.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from tiergate.operator.api import InferencePool
from tiergate.plan import load_plan, plan_fleet, plan_traffic, pool_manifest
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.engine.simulation import SimulationReport, simulate
from tiergate.sim_nodes.perf import build_deployment

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "plan" / "seed.yaml"


def test_each_seed_tier_meets_its_slo_at_the_plan_and_misses_it_one_replica_fewer() -> None:
    plan, base = load_plan(SEED_PLAN)
    plan = plan.model_copy(
        update={"simulation": plan.simulation.model_copy(update={"requests": 150})}
    )
    traffic = plan_traffic(plan, base)
    report = plan_fleet(plan, traffic, default_catalog())
    assert report.met and {t.tier for t in report.tiers} == {"batched", "premium", "wafer-scale"}
    for tier in report.tiers:
        pool = InferencePool.model_validate(
            yaml.safe_load(yaml.safe_dump(pool_manifest(plan.name, tier)))
        )
        spec = pool.spec
        slo = plan.tiers[spec.tier].slo
        deployment = build_deployment(spec, default_catalog())

        assert spec.replicas > 1, f"{spec.tier}: a 1-replica plan cannot show it is tight"
        at_plan, fewer = (
            simulate(
                deployment,
                spec.batching.to_batching(),
                traffic[spec.tier].requests,
                replicas=n,
                slo_ttft_s=slo.ttft_s,
                slo_tpot_s=slo.tpot_s,
                seed=plan.simulation.seed,
            )
            for n in (spec.replicas, spec.replicas - 1)
        )
        assert attained(at_plan) >= slo.attainment, spec.tier
        assert attained(fewer) < slo.attainment, spec.tier


def attained(r: SimulationReport) -> float:
    """The share of all requests that met both targets."""
    return r.goodput_requests_per_s / r.requests_per_s * r.completed / r.requests
