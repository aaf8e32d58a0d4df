"""Per-tenant figures of a `--tenants` run: how the router shared its service among callers.

Service is counted as the router's fair share counts it: tokens (prompt + completion, from
each reply's usage) of the requests that succeeded. A 429 is the router shedding or limiting
a tenant, counted apart from other errors. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from tiergate.bench.figures import in_tier_order, ms, percentile
from tiergate.bench.results import RequestResult

__all__ = ["TenantStats", "tenant_stats"]


class TenantStats(BaseModel):
    """The figures of one tenant of the run."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    concurrency: int = Field(description="The tenant's requests in flight (closed loop).")
    requests: int = Field(description="Requests sent that finished, whatever the outcome.")
    ok: int
    shed: int = Field(description="Requests refused with 429 (shed or rate limited).")
    errors: int = Field(description="Other failures: any other status, stream, timeout, ...")
    prompt_tokens: int = Field(description="Prompt tokens of the successful requests.")
    completion_tokens: int = Field(description="Completion tokens of the successful requests.")
    tokens_served: int = Field(description="prompt_tokens + completion_tokens.")
    tokens_served_share_pct: float | None = Field(
        description="The tenant's share of all tenants' tokens served, in percent."
    )
    tokens_served_per_s: float = Field(description="tokens_served over the run's wall time.")
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    tiers: list[str] = Field(description="Tiers that served its successful requests.")


def tenant_stats(
    results: Sequence[RequestResult], tenants: Mapping[str, int], wall_s: float
) -> list[TenantStats]:
    """One row per tenant of `tenants` (name -> concurrency), in its order."""
    served = {name: _tokens([r for r in results if r.tenant == name and r.ok]) for name in tenants}
    total = sum(prompt + completion for prompt, completion in served.values())
    rows = []
    for name, concurrency in tenants.items():
        mine = [r for r in results if r.tenant == name]
        ok = [r for r in mine if r.ok]
        shed = sum(1 for r in mine if r.error == "429")
        prompt, completion = served[name]
        tokens = prompt + completion
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        rows.append(
            TenantStats(
                tenant=name,
                concurrency=concurrency,
                requests=len(mine),
                ok=len(ok),
                shed=shed,
                errors=len(mine) - len(ok) - shed,
                prompt_tokens=prompt,
                completion_tokens=completion,
                tokens_served=tokens,
                tokens_served_share_pct=100.0 * tokens / total if total > 0 else None,
                tokens_served_per_s=tokens / wall_s if wall_s > 0 else 0.0,
                ttft_p50_ms=ms(percentile(ttfts, 50)),
                ttft_p90_ms=ms(percentile(ttfts, 90)),
                tiers=in_tier_order({r.served_tier for r in ok}),
            )
        )
    return rows


def _tokens(ok: list[RequestResult]) -> tuple[int, int]:
    return sum(r.prompt_tokens for r in ok), sum(r.completion_tokens for r in ok)
