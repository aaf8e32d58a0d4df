"""`tier-filter`: keep endpoints of the request's tier."""

from __future__ import annotations

from collections.abc import Sequence

from tiergate.router.endpoints.state import CandidateSet, EndpointState, RequestContext
from tiergate.router.policy.base import Filter, NoParameters
from tiergate.router.policy.registry import register

__all__ = ["TierFilter"]


@register("tier-filter", NoParameters)
class TierFilter(Filter):
    """Drops endpoints whose pool is of another tier than `ctx.tier`.

    Admission decides fallbacks to another tier (service_tier: auto) by changing `ctx.tier`;
    this filter never crosses tiers on its own, since that would change the price billed.
    The view's `CandidateSet` of the tier is kept whole without a look at its members.
    """

    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        tier = ctx.tier
        if isinstance(candidates, CandidateSet) and candidates.tier == tier:
            return candidates
        if all(ep.tier == tier for ep in candidates):
            return candidates
        return [ep for ep in candidates if ep.tier == tier]
