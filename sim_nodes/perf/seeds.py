"""The seed tiers (catalogs/seed_tiers.yaml) evaluated side by side."""

from __future__ import annotations

from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from tiergate.common.tiers import Tier

from ..catalogs import Catalog
from .spec import ServingSpec, build_deployment
from .steady_state import PerfResult, Workload, evaluate


class SeedWorkload(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


class SeedTier(ServingSpec):
    tier: Tier
    concurrency: int


class SeedFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: SeedWorkload
    tiers: list[SeedTier]


def load_seed_tiers() -> SeedFile:
    pkg = resources.files(__package__.rsplit(".", 1)[0] + ".catalogs")
    data = yaml.safe_load(pkg.joinpath("seed_tiers.yaml").read_text(encoding="utf-8"))
    return SeedFile.model_validate(data)


def evaluate_seed_tiers(catalog: Catalog, seeds: SeedFile | None = None) -> dict[str, PerfResult]:
    """Each seed tier's steady state under the shared agentic workload, by tier name."""
    seeds = seeds or load_seed_tiers()
    out: dict[str, PerfResult] = {}
    for t in seeds.tiers:
        w = seeds.workload
        workload = Workload(w.input_tokens, w.output_tokens, w.cached_input_tokens, t.concurrency)
        kv_tokens = t.concurrency * workload.tokens_per_sequence
        deployment = build_deployment(t, catalog, kv_tokens=kv_tokens)
        out[t.tier] = evaluate(deployment, workload, t.batching.to_batching())
    return out
