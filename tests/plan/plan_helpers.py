"""Small plans whose search spaces are tiny, for tests of the planner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiergate.plan import PlanFile


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
