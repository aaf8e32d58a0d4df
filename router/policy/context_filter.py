"""`context-filter`: keep the endpoints whose pool serves a context as long as the request's."""

from __future__ import annotations

from collections.abc import Sequence

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import Filter, NoParameters, PluginContext, holding
from tiergate.router.policy.registry import register

__all__ = ["ContextFilter"]


@register("context-filter", NoParameters)
class ContextFilter(Filter):
    """Drops the endpoints of pools whose context (spec.maxContextTokens, else the model's)
    is shorter than the request's prompt (estimated) and output cap: their engine would
    refuse it while a pool with a longer context in the same tier could serve it.

    When every pool of the tier serves the request's length (pools of one model and tier
    usually serve one context) it keeps the candidates as they are, without a look at each.
    When none does, it keeps them all: the engine's own 400 (`context_length_exceeded`) says
    the limit exactly, where the router has only an estimate of the prompt. But when a
    provider left out for being at its pool's `maxConcurrentRequests` would hold it, it keeps
    none: the router sheds the request with 429 `provider_at_limit`, to be retried shortly,
    rather than have an engine that never could serve it refuse it for good. It learns which
    providers were left out from the tier's candidate set, which the filters that sample or
    drop endpoints (`random-sample`, `ejected-filter`, `slo-filter`) do not pass on: it goes
    before them.
    """

    def __init__(self, name: str, parameters: NoParameters, context: PluginContext) -> None:
        super().__init__(name, parameters, context)
        self.pools = context.pools

    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        pools, model, tier, tokens = self.pools(), ctx.model, ctx.tier, ctx.context_tokens
        kept = holding(pools, candidates, model, tier, tokens)
        if kept:
            return kept
        if holding(pools, getattr(candidates, "at_limit", ()), model, tier, tokens):
            return []
        return candidates
