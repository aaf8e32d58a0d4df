"""Small plans whose search spaces are tiny, for tests of the planner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tiergate.plan import Configuration, PlanFile, plan_traffic
from tiergate.plan.screen import Screen, screen
from tiergate.plan.space import Candidate, candidates
from tiergate.sim_nodes.catalogs import default_catalog


def tiny_plan(**tier: Any) -> dict[str, Any]:
    """A batched tier of llama-3.1-8b over two GPUs, a few caps and one dtype: ~15
    configurations, each simulated in milliseconds."""
    demand: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "ratePerS": 60,
        "promptTokens": "uniform:200:800",
        "outputTokens": "lognormal:80:0.4",
        "cachedShare": 0.25,
        "slo": {"percentile": 90, "ttftMs": 300, "tpotMs": 12},
    }
    demand.update(tier)
    return {
        "name": "tiny",
        "tiers": {"batched": demand},
        "search": {
            "accelerators": ["a100-80gb", "h100-sxm"],
            "weightDtypes": ["bf16"],
            "kvDtypes": ["bf16"],
            "batchCaps": [8, 32, 128],
            "maxChipMultiple": 2,
            "maxReplicas": 8,
        },
        "simulation": {"requests": 600, "seed": 3},
    }


def write_plan(folder: Path, data: dict[str, Any], name: str = "plan.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def parsed(data: dict[str, Any]) -> PlanFile:
    return PlanFile.model_validate(data)


def screened(plan: PlanFile, tier: str = "batched", base: Path = Path(".")) -> list[Screen]:
    """Every configuration of one of the plan's tiers, screened."""
    catalog = default_catalog()
    traffic = plan_traffic(plan, base)[tier]  # type: ignore[index]
    demand = plan.tiers[tier]  # type: ignore[index]
    space = candidates(
        tier,  # type: ignore[arg-type]
        demand,
        plan.search,
        catalog,
        tokens_per_request=traffic.shape.tokens_per_sequence,
        longest_request=traffic.longest_tokens,
    )
    return [screen(c, catalog, traffic.shape, demand.slo, traffic.rate_per_s) for c in space]


def screened_one(plan: PlanFile, tier: str, c: Configuration, base: Path = Path(".")) -> Screen:
    """The planned configuration `c` of one of the plan's tiers, screened."""
    catalog = default_catalog()
    traffic = plan_traffic(plan, base)[tier]  # type: ignore[index]
    candidate = Candidate.of(c)
    slo = plan.tiers[tier].slo  # type: ignore[index]
    return screen(candidate, catalog, traffic.shape, slo, traffic.rate_per_s)


#: Generous: each case takes about a second of CPU; this only stops a hang.
HANG_S = 60


def plan_cli(path: Path) -> subprocess.CompletedProcess[str]:
    """`tiergate plan PATH` in a subprocess, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "tiergate.cli", "plan", str(path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
