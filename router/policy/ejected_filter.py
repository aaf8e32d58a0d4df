"""`ejected-filter`: skip endpoints that outlier detection has ejected for now."""

from __future__ import annotations

from collections.abc import Sequence

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import Filter, NoParameters
from tiergate.router.policy.registry import register

__all__ = ["EjectedFilter"]


@register("ejected-filter", NoParameters)
class EjectedFilter(Filter):
    """Drops ejected endpoints, unless every candidate is ejected.

    With all of them ejected, keeping them all ("panic mode", as Envoy does) serves whatever
    still works instead of turning a partial outage into a certain 503; the proxy's retries
    then try the others in turn.

    It looks at every candidate, so the default policy runs it after `random-sample`, on the
    sample (which already passes over ejected endpoints while drawing).
    """

    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        healthy = [ep for ep in candidates if now_s >= ep.ejected_until_s]
        if not healthy or len(healthy) == len(candidates):
            return candidates
        return healthy
