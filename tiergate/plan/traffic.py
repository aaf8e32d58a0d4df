"""Each tier's traffic as requests: drawn from the plan's distributions, or read from a trace.

Poisson traffic is a seeded stream as long as the largest window (window.py); every trial
replays a prefix of it, so candidates are compared on identical arrivals and lengths. The
steady-state model sees the mean shape.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tiergate.common.tiers import Tier
from tiergate.common.validation import first_problem
from tiergate.sim_nodes.engine.workload import MAX_ARRIVAL_S, WorkloadRequest
from tiergate.sim_nodes.perf import Workload

from .errors import PlanError
from .files import parse_json, read_text
from .spec import (
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_WINDOW_REQUESTS,
    PlanFile,
    TierDemand,
)

__all__ = ["TierTraffic", "TraceLine", "plan_traffic"]


@dataclass(frozen=True, slots=True)
class TierTraffic:
    """A tier's requests (sorted by arrival), their rate and their mean shape."""

    tier: Tier
    requests: tuple[WorkloadRequest, ...]
    rate_per_s: float
    #: Drawn Poisson arrivals (a window may slow them for a slice of the fleet), not a trace.
    poisson: bool = True

    @property
    def shape(self) -> Workload:
        """The mean request, as the steady-state model takes it."""
        n = len(self.requests)
        prompt = max(1, round(sum(r.prompt_tokens for r in self.requests) / n))
        cached = round(sum(r.cached_prompt_tokens for r in self.requests) / n)
        output = max(1, round(sum(r.output_tokens for r in self.requests) / n))
        return Workload(prompt, output, min(cached, prompt - 1), concurrency=1)

    @property
    def longest_tokens(self) -> int:
        return max(r.prompt_tokens + r.output_tokens for r in self.requests)


class TraceLine(BaseModel):
    """One line of a plan's trace: a request and the tier it asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arrival_s: float = Field(
        ge=0, le=MAX_ARRIVAL_S, allow_inf_nan=False, description="Arrival time, seconds."
    )
    tier: Tier = Field(description="The tier the request asks for.")
    prompt_tokens: int = Field(ge=1, le=MAX_PROMPT_TOKENS, description="Prompt length, tokens.")
    output_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS, description="Tokens to generate.")
    cached_prompt_tokens: int = Field(
        default=0, ge=0, le=MAX_PROMPT_TOKENS, description="Prefix-cache hit, tokens."
    )


def plan_traffic(plan: PlanFile, base: Path) -> dict[Tier, TierTraffic]:
    """Every planned tier's traffic; PlanError naming the trace line or the tier."""
    if plan.trace is not None:
        return _from_trace(plan, base / plan.trace)
    out: dict[Tier, TierTraffic] = {}
    for tier, demand in plan.tiers.items():
        # A string seed: each tier's draws are independent of which other tiers are planned.
        rng = random.Random(f"{plan.simulation.seed}:{tier}")
        out[tier] = _poisson(tier, demand, MAX_WINDOW_REQUESTS, rng)
    return out


def _poisson(tier: Tier, demand: TierDemand, n: int, rng: random.Random) -> TierTraffic:
    assert demand.rate_per_s is not None  # the plan file's validator requires it
    prompt, output = demand.prompt, demand.output
    requests = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(demand.rate_per_s)
        p = prompt.sample(rng)
        cached = min(int(p * demand.cached_share), p - 1)
        requests.append(WorkloadRequest(t, p, output.sample(rng), cached))
    return TierTraffic(tier, tuple(requests), demand.rate_per_s)


def _from_trace(plan: PlanFile, path: Path) -> dict[Tier, TierTraffic]:
    lines = read_text(path, "trace").splitlines()
    by_tier: dict[Tier, list[WorkloadRequest]] = {tier: [] for tier in plan.tiers}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        raw = parse_json(line, where)
        try:
            record = TraceLine.model_validate(raw)
        except ValidationError as exc:
            raise PlanError(f"{where}: {first_problem(exc, default_field='record')}") from None
        if record.cached_prompt_tokens >= record.prompt_tokens:
            raise PlanError(f"{where}: cached_prompt_tokens must be below prompt_tokens")
        if record.tier in by_tier:
            by_tier[record.tier].append(
                WorkloadRequest(
                    record.arrival_s,
                    record.prompt_tokens,
                    record.output_tokens,
                    record.cached_prompt_tokens,
                )
            )
    out: dict[Tier, TierTraffic] = {}
    for tier, requests in by_tier.items():
        if len(requests) < 2:
            raise PlanError(f"trace {path.name} has {len(requests)} request(s) of tier {tier}")
        requests.sort(key=lambda r: r.arrival_s)
        span = requests[-1].arrival_s - requests[0].arrival_s
        if span <= 0:
            raise PlanError(f"trace {path.name}: tier {tier}'s requests all arrive at once")
        # n arrivals span n - 1 gaps.
        out[tier] = TierTraffic(tier, tuple(requests), (len(requests) - 1) / span, poisson=False)
    return out
