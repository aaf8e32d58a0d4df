"""`queue-depth-scorer`: prefer endpoints with fewer queued and in-flight requests."""

from __future__ import annotations

from collections.abc import Sequence

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import NoParameters, Scorer
from tiergate.router.policy.registry import register

__all__ = ["QueueDepthScorer", "queue_load"]


def queue_load(ep: EndpointState) -> float:
    """Requests waiting at the endpoint (last scrape) plus those the router has open to it.

    The two overlap (a request the router sent may be waiting there), but the in-flight count
    moves the moment the router routes, while the scrape is up to an interval old: without it
    a burst would pile onto whichever endpoint looked idlest at the last scrape.
    """
    return (ep.waiting or 0.0) + ep.inflight


@register("queue-depth-scorer", NoParameters)
class QueueDepthScorer(Scorer):
    """Min-max normalised across candidates: the least loaded gets 1, the most loaded 0.

    All equal (including a single candidate, or no metrics yet and nothing in flight) -> 1.
    """

    def score(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[float]:
        loads = [queue_load(ep) for ep in candidates]
        low, high = min(loads), max(loads)
        if high <= low:
            return [1.0] * len(loads)
        span = high - low
        return [(high - load) / span for load in loads]
