"""Planner validation on the seed workload (examples/plan/seed.yaml): each tier's emitted
pool, simulated on the plan's window at the planned replicas, meets the SLO percentile, and
one replica fewer does not meet it (it misses, or falls below the steady-state floor). The
full-size run is benchmarks/plan_search.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from plan_helpers import screened_one

from tiergate.plan import load_plan, plan_fleet, plan_traffic, pool_manifest
from tiergate.plan.confirm import attainment, run_trial
from tiergate.plan.window import window
from tiergate.pools import InferencePool
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.engine.simulation import simulate
from tiergate.sim_nodes.perf import build_deployment

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "plan" / "seed.yaml"


def test_each_seed_tier_meets_its_slo_at_the_plan_and_not_one_replica_fewer() -> None:
    plan, base = load_plan(SEED_PLAN)
    traffic = plan_traffic(plan, base)
    report = plan_fleet(plan, traffic, default_catalog())
    assert report.met and {t.tier for t in report.tiers} == {"batched", "premium", "wafer-scale"}
    for tier in report.tiers:
        pool = InferencePool.model_validate(
            yaml.safe_load(yaml.safe_dump(pool_manifest(plan.name, tier)))
        )
        spec = pool.spec
        slo = plan.tiers[spec.tier].slo
        assert tier.plan is not None
        chosen = screened_one(plan, spec.tier, tier.plan.configuration, base)
        assert str(chosen.candidate) == tier.plan.configuration.summary
        w = window(traffic[spec.tier], chosen, spec.replicas, plan.simulation.requests)
        at_plan = simulate(
            build_deployment(spec, default_catalog()),
            spec.batching.to_batching(),
            w.requests,
            replicas=w.replicas,
            slo_ttft_s=slo.ttft_s,
            slo_tpot_s=slo.tpot_s,
            seed=plan.simulation.seed,
            measured_s=w.measured_s,
        )
        assert attainment(at_plan) >= slo.attainment, spec.tier
        assert spec.replicas >= chosen.floor_replicas, spec.tier
        if spec.replicas > 1:
            fewer = run_trial(
                chosen,
                traffic[spec.tier],
                slo,
                spec.replicas - 1,
                seed=plan.simulation.seed,
                fewest_requests=plan.simulation.requests,
            )
            assert not fewer.meets, spec.tier
