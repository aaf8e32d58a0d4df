"""`slo-filter`: keep the endpoints the performance model expects to meet the request's SLO."""

from __future__ import annotations

from collections.abc import Sequence

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import Filter, NoEndpointFits, NoParameters, PluginContext
from tiergate.router.policy.latency import LatencyEstimate, LatencyPredictor, endpoint_load
from tiergate.router.policy.registry import register

__all__ = ["SloFilter"]


@register("slo-filter", NoParameters)
class SloFilter(Filter):
    """Drops the candidates predicted to miss the request's `x-slo-ttft-ms` / `x-slo-tpot-ms`
    given their current load; a request without an SLO keeps them all. An endpoint whose pool
    the perf model does not know is kept (the benefit of the doubt).

    When none is predicted to meet it, the request is refused at once (`NoEndpointFits`,
    naming the best prediction) rather than served late.
    """

    def __init__(self, name: str, parameters: NoParameters, context: PluginContext) -> None:
        super().__init__(name, parameters, context)
        self.predictor = LatencyPredictor(context.pools)

    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        ttft_slo, tpot_slo = ctx.slo_ttft_s, ctx.slo_tpot_s
        if ttft_slo is None and tpot_slo is None:
            return candidates
        best: LatencyEstimate | None = None
        kept = []
        for endpoint in candidates:
            estimate = self.predictor.predict(
                endpoint.pool, endpoint_load(endpoint), ctx.prompt_tokens, ctx.max_output_tokens
            )
            if estimate is None:
                kept.append(endpoint)
            elif (ttft_slo is None or estimate.ttft_s <= ttft_slo) and (
                tpot_slo is None or estimate.tpot_s <= tpot_slo
            ):
                kept.append(endpoint)
            elif best is None or estimate.total_s < best.total_s:
                best = estimate
        if kept:
            return kept
        detail = (
            f" (best predicted: TTFT {best.ttft_s * 1000:.0f} ms, TPOT {best.tpot_s * 1000:.1f} ms)"
            if best is not None
            else ""
        )
        raise NoEndpointFits(
            f"no endpoint is predicted to meet the requested SLO{detail}", "slo_unattainable"
        )
