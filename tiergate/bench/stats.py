"""From request results to the figures the bench reports: per tier, and per tenant with
--tenants (`fairness`). Pure: no I/O, no clock.

Rows are keyed by the tier that *served* a request (a request that failed before any tier
said so counts for the tier it asked for). Escalations are the exception: a cascade starts
on the requested tier and is counted there, whichever tier finally served the request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from tiergate.bench.fairness import TenantStats, tenant_stats
from tiergate.bench.figures import in_tier_order, ms, percentile
from tiergate.bench.results import RequestResult

__all__ = [
    "BenchReport",
    "RunInfo",
    "SloTargets",
    "TierStats",
    "percentile",
    "summarize",
    "tokens_per_s_per_stream",
]


class TierStats(BaseModel):
    """The figures of one tier (or of all of them, `tier: "all"`)."""

    model_config = ConfigDict(frozen=True)

    tier: str
    requests: int = Field(description="Requests counted for this tier (errors included).")
    errors: int
    errors_by_kind: dict[str, int] = Field(
        description="HTTP status ('503') or 'stream', 'timeout', 'connect', 'transport'."
    )
    error_examples: dict[str, str] = Field(
        description="The first error message of each kind, to tell what went wrong."
    )
    pools: list[str] = Field(description="Pools that served the tier's requests (if told).")
    output_tokens: int = Field(description="Completion tokens of the successful requests.")
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    e2e_p50_ms: float | None
    output_tokens_per_s_per_stream_p50: float | None = Field(
        description="(completion tokens - 1) / (e2e - TTFT) of each stream, median."
    )
    throughput_output_tokens_per_s: float = Field(
        description="Output tokens of the tier over the run's wall time."
    )
    cost_usd: float | None = Field(description="Cost of the requests that reported one.")
    cost_per_million_output_tokens_usd: float | None
    tool_calls: int = Field(description="Successful requests that carried tools.")
    tool_call_errors: int
    tool_call_error_rate: float | None
    escalations: int = Field(description="Requests asking for this tier that were escalated.")
    slo_attainment: float | None = Field(
        default=None,
        description="Share of the tier's requests that succeeded within every --slo-* target "
        "(a failed request missed them); None without targets.",
    )


class SloTargets(BaseModel):
    """What a request must meet to count as served within the SLO (--slo-ttft-ms,
    --slo-tpot-ms); a target left out is not checked."""

    model_config = ConfigDict(frozen=True)

    ttft_ms: float | None = Field(default=None, description="Time to first token, at most.")
    tpot_ms: float | None = Field(
        default=None,
        description="Time per output token after the first, at most: (e2e - TTFT) / "
        "(completion tokens - 1).",
    )

    def met_by(self, result: RequestResult) -> bool:
        """The request succeeded within every target."""
        if not result.ok or result.ttft_s is None:
            return False
        if self.ttft_ms is not None and result.ttft_s * 1000 > self.ttft_ms:
            return False
        speed = tokens_per_s_per_stream(result)
        return self.tpot_ms is None or speed is None or 1000 / speed <= self.tpot_ms


class RunInfo(BaseModel):
    """How the run was set up."""

    model_config = ConfigDict(frozen=True)

    url: str
    requests: int | None = Field(description="Requests planned; None: as many as fit duration_s.")
    duration_s: float | None = Field(
        default=None, description="How long the run sent requests (--duration), if limited."
    )
    concurrency: int = Field(description="Requests in flight at once, all tenants together.")
    tenants: dict[str, int] = Field(
        default_factory=dict, description="Concurrency of each tenant (--tenants), in file order."
    )
    mix: dict[str, float]
    models: dict[str, str] = Field(description="Model asked for, per requested tier.")
    input_tokens: int
    max_tokens: int = Field(description="Output cap per request (the highest, with a range).")
    min_max_tokens: int | None = Field(
        default=None, description="The lowest cap of a range (--max-tokens LOW-HIGH), if any."
    )
    tools_fraction: float
    seed: int
    pause_s: float = Field(
        default=0.0, description="What each worker waited after a reply (--pause), seconds."
    )
    interrupted: bool = Field(
        default=False,
        description="Stopped early (Ctrl-C): the figures are those of the requests finished.",
    )
    slo: SloTargets | None = Field(
        default=None, description="The targets each tier's slo_attainment counts against."
    )


class BenchReport(BaseModel):
    """The whole result of `tiergate bench` (its `--json` output)."""

    model_config = ConfigDict(frozen=True)

    run: RunInfo
    wall_s: float
    tiers: list[TierStats] = Field(description="One row per tier, in tier order.")
    total: TierStats
    tenants: list[TenantStats] = Field(
        default_factory=list, description="One row per tenant of --tenants, in file order."
    )


def tokens_per_s_per_stream(result: RequestResult) -> float | None:
    """Decode speed of one stream: tokens after the first over the time after the first."""
    if result.ttft_s is None or result.e2e_s is None or result.completion_tokens < 2:
        return None
    decode_s = result.e2e_s - result.ttft_s
    return (result.completion_tokens - 1) / decode_s if decode_s > 0 else None


def summarize(results: Iterable[RequestResult], run: RunInfo, wall_s: float) -> BenchReport:
    """The report of a run whose requests ended as `results` within `wall_s` seconds."""
    results = list(results)
    escalations = Counter(r.requested_tier for r in results if r.escalated)
    tiers = {r.served_tier for r in results} | set(escalations)
    rows = [
        _tier_stats(
            tier, [r for r in results if r.served_tier == tier], escalations[tier], wall_s, run.slo
        )
        for tier in in_tier_order(tiers)
    ]
    total = _tier_stats("all", results, sum(escalations.values()), wall_s, run.slo)
    return BenchReport(
        run=run,
        wall_s=wall_s,
        tiers=rows,
        total=total,
        tenants=tenant_stats(results, run.tenants, wall_s),
    )


def _tier_stats(
    tier: str,
    results: list[RequestResult],
    escalations: int,
    wall_s: float,
    slo: SloTargets | None,
) -> TierStats:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    speeds = [s for s in map(tokens_per_s_per_stream, ok) if s is not None]
    output_tokens = sum(r.completion_tokens for r in ok)
    costed = [r for r in ok if r.cost_usd is not None]
    cost = sum(r.cost_usd for r in costed if r.cost_usd is not None) if costed else None
    costed_tokens = sum(r.completion_tokens for r in costed)
    per_million = cost / costed_tokens * 1e6 if cost is not None and costed_tokens > 0 else None
    tool = [r for r in ok if r.tool_call_valid is not None]
    tool_errors = sum(1 for r in tool if not r.tool_call_valid)
    return TierStats(
        tier=tier,
        requests=len(results),
        errors=len(results) - len(ok),
        errors_by_kind=dict(sorted(Counter(r.error for r in results if r.error).items())),
        error_examples=_first_messages(results),
        pools=sorted({r.pool for r in results if r.pool}),
        output_tokens=output_tokens,
        ttft_p50_ms=ms(percentile(ttfts, 50)),
        ttft_p95_ms=ms(percentile(ttfts, 95)),
        e2e_p50_ms=ms(percentile(e2es, 50)),
        output_tokens_per_s_per_stream_p50=percentile(speeds, 50),
        throughput_output_tokens_per_s=output_tokens / wall_s if wall_s > 0 else 0.0,
        cost_usd=cost,
        cost_per_million_output_tokens_usd=per_million,
        tool_calls=len(tool),
        tool_call_errors=tool_errors,
        tool_call_error_rate=tool_errors / len(tool) if tool else None,
        escalations=escalations,
        slo_attainment=(
            sum(map(slo.met_by, results)) / len(results) if slo is not None and results else None
        ),
    )


def _first_messages(results: list[RequestResult]) -> dict[str, str]:
    examples: dict[str, str] = {}
    for r in results:
        if r.error is not None and r.error not in examples:
            examples[r.error] = r.error_message or ""
    return dict(sorted(examples.items()))
