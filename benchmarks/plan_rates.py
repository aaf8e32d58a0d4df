"""Benchmark: `tiergate plan` from 100 to 10,000 req/s on one fixed configuration, on one core.

The space is llama-3.1-8b on one H100 at fp8 with batch cap 64 (1,024-token prompts,
256-token outputs, SLO p90 TTFT <= 500 ms and TPOT <= 30 ms unless asked). Per rate it
prints the replicas planned, the steady-state floor, the window the planner simulated
(requests, replicas simulated of the fleet, request lifetimes spanned), whether the planned
fleet, simulated whole over a steady window of fresh arrivals (`--steady-lifetimes` request
lifetimes, the first and last not measured), meets the SLO, and the plan's wall and CPU time (the
machine may be shared: CPU time is the steadier figure). Not a
test: the figures go into benchmarks/README.md with the commit.

    .venv/bin/python -P benchmarks/plan_rates.py [--rates 100,200] [--tpot-ms 9]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

from tiergate.common.cli import table
from tiergate.plan import PlanFile, TierPlan, plan_fleet, plan_traffic
from tiergate.plan.confirm import attainment
from tiergate.plan.screen import screen
from tiergate.plan.space import candidates
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.engine.simulation import simulate
from tiergate.sim_nodes.engine.workload import parse_length, poisson_workload

RATES = (100, 200, 500, 1_000, 2_000, 5_000, 10_000)


def fixed_space(rate_per_s: float, ttft_ms: float = 500, tpot_ms: float = 30) -> PlanFile:
    """One configuration: llama-3.1-8b, one H100, fp8 weights and KV, batch cap 64."""
    data: dict[str, Any] = {
        "name": "fixed",
        "tiers": {
            "batched": {
                "model": "llama-3.1-8b",
                "ratePerS": rate_per_s,
                "promptTokens": "1024",
                "outputTokens": "256",
                "slo": {"percentile": 90, "ttftMs": ttft_ms, "tpotMs": tpot_ms},
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
    return PlanFile.model_validate(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default=",".join(str(r) for r in RATES))
    parser.add_argument("--steady-lifetimes", type=float, default=12.0)
    parser.add_argument("--ttft-ms", type=float, default=500.0)
    parser.add_argument("--tpot-ms", type=float, default=30.0)
    args = parser.parse_args()
    pinned = "no"
    if hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        pinned = f"core {core}"
    print(
        f"fixed space: llama-3.1-8b, 1x h100-sxm, fp8/fp8, cap 64; SLO p90 TTFT <= "
        f"{args.ttft_ms:g} ms, TPOT <= {args.tpot_ms:g} ms; pinned to {pinned}"
    )
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        plan = fixed_space(rate, args.ttft_ms, args.tpot_ms)
        start, cpu = time.perf_counter(), time.process_time()
        tier = plan_fleet(plan, plan_traffic(plan, Path(".")), default_catalog()).tiers[0]
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        rows.append(_row(plan, tier, rate, wall, cpu, args.steady_lifetimes))
        print(" | ".join(rows[-1]), flush=True)
    headers = ["req/s", "replicas", "floor", "window", "steady window", "SLO met", "plan wall"]
    headers += ["plan CPU"]
    print()
    print(table(headers, rows))


def _row(
    plan: PlanFile, tier: TierPlan, rate: float, wall_s: float, cpu_s: float, lifetimes: float
) -> list[str]:
    p, w = tier.plan or tier.closest, tier.window
    assert p is not None and w is not None
    window = (
        f"{w.requests:,} req on {w.replicas_simulated}/{w.fleet_replicas}, "
        f"{w.lifetimes:.1f} lifetimes{' (cut)' if w.cut_by_budget else ''}"
    )
    requests, attained = _steady(plan, p.replicas, rate, w.request_lifetime_s, lifetimes)
    slo = plan.tiers["batched"].slo
    met = "yes" if tier.met and attained >= slo.attainment else "NO"
    return [
        f"{rate:,.0f}",
        f"{p.replicas}{'' if tier.met else ' (unmet)'}",
        str(p.steady_state_floor_replicas),
        window,
        f"{requests:,} req, {attained:.1%}",
        met,
        f"{wall_s:.2f} s",
        f"{cpu_s:.2f} s",
    ]


def _steady(
    plan: PlanFile, replicas: int, rate: float, lifetime_s: float, lifetimes: float
) -> tuple[int, float]:
    """(requests measured, share within the SLO) of the whole fleet over fresh arrivals that
    span `lifetimes` request lifetimes, the first and last lifetime not measured."""
    catalog = default_catalog()
    demand = plan.tiers["batched"]
    [candidate] = candidates(
        "batched", demand, plan.search, catalog, tokens_per_request=1280, longest_request=1280
    )
    prompt, output = parse_length(demand.prompt_tokens), parse_length(demand.output_tokens)
    s = screen(candidate, catalog, _shape(plan), demand.slo, rate)
    span_s = lifetimes * lifetime_s
    requests = poisson_workload(
        round(rate * span_s), rate, prompt, output, random.Random("steady window")
    )
    report = simulate(
        s.deployment,
        candidate.serving_spec().batching.to_batching(),
        requests,
        replicas=replicas,
        slo_ttft_s=demand.slo.ttft_s,
        slo_tpot_s=demand.slo.tpot_s,
        measured_s=(lifetime_s, span_s - lifetime_s),
    )
    return report.requests, attainment(report)


def _shape(plan: PlanFile) -> Any:
    return plan_traffic(plan, Path("."))["batched"].shape


if __name__ == "__main__":
    main()
