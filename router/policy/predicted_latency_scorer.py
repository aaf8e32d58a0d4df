"""`predicted-latency-scorer`: prefer the endpoint the perf model says finishes soonest."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import Parameters, PluginContext, Scorer
from tiergate.router.policy.latency import LatencyPredictor
from tiergate.router.policy.registry import register

__all__ = ["PredictedLatencyParameters", "PredictedLatencyScorer"]


class PredictedLatencyParameters(Parameters):
    unknown_score: float = Field(
        default=0.5, ge=0, le=1, description="Score of an endpoint whose pool has no perf model."
    )
    other_context_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Context assumed for the other sequences in a batch "
        "(default: this request's prompt plus half its output).",
    )


@register("predicted-latency-scorer", PredictedLatencyParameters)
class PredictedLatencyScorer(Scorer):
    """Predicted TTFT + output time of this request on each candidate (see `latency`).

    Score = fastest prediction / this prediction, so the fastest candidate gets 1 and one
    predicted twice as slow gets 0.5: a ratio keeps the scale meaningful across hardware (a
    wafer-scale endpoint 10x faster should dominate, not just rank first).
    """

    def __init__(
        self, name: str, parameters: PredictedLatencyParameters, context: PluginContext
    ) -> None:
        super().__init__(name, parameters, context)
        self.unknown_score = parameters.unknown_score
        self.predictor = LatencyPredictor(
            context.pools, other_context_tokens=parameters.other_context_tokens
        )

    def score(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[float]:
        totals = self.predictor.totals(candidates, ctx.prompt_tokens, ctx.max_output_tokens)
        known = [t for t in totals if t is not None]
        if not known:
            return [self.unknown_score] * len(candidates)
        fastest = min(known)
        unknown = self.unknown_score
        return [unknown if t is None else (fastest / t if t > 0 else 1.0) for t in totals]
