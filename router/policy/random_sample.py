"""`random-sample`: score a bounded random sample of a large pool ("power of k choices").

Scoring every endpoint makes each request cost more as the pool grows. Load balancers at scale
compare a few endpoints drawn at random instead: with two choices the busiest endpoint's load
already drops exponentially compared with one random choice, and each extra choice helps less.
This stage keeps `size` endpoints drawn uniformly at random, plus every endpoint a scorer
favours for this request (prefix affinity's warm caches: at most a few), so the scorers and
the picker after it see at most `size` + favoured candidates whatever the pool's size.

Drawing costs O(size): indices are drawn at random, never by walking the candidates. Ejected
endpoints are passed over while drawing, as a load balancer samples its healthy hosts: a pool
with many ejected endpoints still yields a sample of healthy ones, which the `ejected-filter`
after this stage (it sees only the sample) could not find. They fill the sample only when
too few others turn up within the draw budget. A pool no larger than the sample passes
through untouched.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pydantic import Field

from tiergate.router.endpoints.state import CandidateSet, EndpointState, RequestContext
from tiergate.router.policy.base import Parameters, PluginContext, Sampler
from tiergate.router.policy.registry import register

__all__ = ["RandomSample", "RandomSampleParameters"]

#: Random draws per sample slot before giving up on finding enough endpoints not ejected.
DRAWS_PER_SLOT = 4


class RandomSampleParameters(Parameters):
    size: int = Field(
        default=8,
        ge=1,
        le=4096,
        description=(
            "Endpoints drawn at random per request (favoured endpoints come on top); also all "
            "that a request's retries can try."
        ),
    )


@register("random-sample", RandomSampleParameters)
class RandomSample(Sampler):
    """`size` random candidates (not ejected, when enough are) plus the favoured ones."""

    def __init__(
        self, name: str, parameters: RandomSampleParameters, context: PluginContext
    ) -> None:
        super().__init__(name, parameters, context)
        self.size = parameters.size
        self.rng = context.rng

    def sample(
        self,
        ctx: RequestContext,
        candidates: Sequence[EndpointState],
        favoured_urls: Collection[str],
        now_s: float,
    ) -> Sequence[EndpointState]:
        n, size = len(candidates), self.size
        if n <= size:
            return candidates
        favoured = _members(candidates, favoured_urls)
        if n <= size + len(favoured):
            return candidates
        seen = {id(ep) for ep in favoured}
        drawn: list[EndpointState] = []
        ejected: list[EndpointState] = []
        draw = self.rng.random
        for _ in range(size * DRAWS_PER_SLOT):
            ep = candidates[int(draw() * n)]  # random() < 1, so the index is < n
            if id(ep) in seen:
                continue
            seen.add(id(ep))
            if now_s < ep.ejected_until_s:
                ejected.append(ep)
                continue
            drawn.append(ep)
            if len(drawn) == size:
                break
        return [*favoured, *drawn, *ejected[: size - len(drawn)]]


def _members(candidates: Sequence[EndpointState], urls: Collection[str]) -> list[EndpointState]:
    """The candidates whose URL is in `urls`: a lookup per URL in a `CandidateSet`, a scan of
    any other sequence (only outside the request path, which passes the view's sets)."""
    if not urls:
        return []
    if isinstance(candidates, CandidateSet):
        found = (candidates.by_url.get(url) for url in dict.fromkeys(urls))
        return [ep for ep in found if ep is not None]
    wanted = set(urls)
    return [ep for ep in candidates if ep.url in wanted]
