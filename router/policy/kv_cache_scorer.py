"""`kv-cache-utilization-scorer`: prefer endpoints with free KV cache."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import Parameters, PluginContext, Scorer
from tiergate.router.policy.registry import register

__all__ = ["KvCacheUtilizationParameters", "KvCacheUtilizationScorer"]


class KvCacheUtilizationParameters(Parameters):
    unknown_score: float = Field(
        default=0.5, ge=0, le=1, description="Score of an endpoint not scraped yet."
    )


@register("kv-cache-utilization-scorer", KvCacheUtilizationParameters)
class KvCacheUtilizationScorer(Scorer):
    """1 - KV cache usage: a full cache means the next long request preempts someone.

    Not normalised across candidates: usage is already a fraction, and 0.9 versus 0.95 is
    close to equally bad, which min-max scaling would hide. An endpoint without metrics yet
    gets `unknown_score` (0.5 by default) so a fresh endpoint is neither shunned nor flooded.
    """

    def __init__(
        self, name: str, parameters: KvCacheUtilizationParameters, context: PluginContext
    ) -> None:
        super().__init__(name, parameters, context)
        self.unknown_score = parameters.unknown_score

    def score(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[float]:
        unknown = self.unknown_score
        # The scraper clamps kv_usage into [0, 1], so no clamping per request here.
        return [unknown if ep.kv_usage is None else 1.0 - ep.kv_usage for ep in candidates]
