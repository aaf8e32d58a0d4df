"""`model-filter`: keep endpoints whose pool serves the requested model name."""

from __future__ import annotations

from collections.abc import Sequence

from tiergate.router.endpoints.state import CandidateSet, EndpointState, RequestContext
from tiergate.router.policy.base import Filter, NoParameters
from tiergate.router.policy.registry import register

__all__ = ["ModelFilter"]


@register("model-filter", NoParameters)
class ModelFilter(Filter):
    """Drops endpoints that do not serve `ctx.model` (under any of their served names).

    The request path passes the view's `CandidateSet` for the model, kept whole without a
    look at its members: the view built it from the pools serving that name.
    """

    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        model = ctx.model
        if isinstance(candidates, CandidateSet) and candidates.model == model:
            return candidates
        if all(model in ep.served_names for ep in candidates):
            return candidates  # the usual case (pre-indexed candidates): no copy
        return [ep for ep in candidates if model in ep.served_names]
