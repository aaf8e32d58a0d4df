"""What the router knows about its endpoints and about the request being routed.

`EndpointState` is the live view of one serving endpoint (a sim node or any vLLM-compatible
server): its pool and tier, the load its `/metrics` last reported, and the router's own
in-flight count. The scraper and the proxy update it; the policy plugins only read it.
`CandidateSet` is the endpoints that can serve one (model, tier), indexed once per pool view.
`RequestContext` is what the policy plugins may know about a request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tiergate.router.base.tiers import Tier
from tiergate.router.endpoints.hosted import HostedApi


@dataclass(slots=True)
class EndpointState:
    """One endpoint of one pool, as the router sees it now."""

    url: str  # base URL, e.g. http://127.0.0.1:9000
    pool: str
    tier: Tier
    model: str  # catalog model name of the pool
    served_names: tuple[str, ...]  # model names clients may ask this pool for
    # From the endpoint's /metrics (vLLM names); None until the first successful scrape.
    running: float | None = None  # vllm:num_requests_running
    waiting: float | None = None  # vllm:num_requests_waiting
    kv_usage: float | None = None  # vllm:kv_cache_usage_perc, 0..1
    scraped_at_s: float | None = None  # router clock time of the last successful scrape
    scrape_failures: int = 0  # consecutive failed scrapes (0 after a success)
    # Router clock time the endpoint last answered a scrape at all (metrics or not): a node
    # that stops answering has hung, or its host is gone.
    answered_at_s: float | None = None
    # The router's own view.
    inflight: int = 0  # requests the router has open to this endpoint
    consecutive_failures: int = 0
    ejected_until_s: float = 0.0  # outlier detection: not picked before this time
    ejections: int = 0  # outlier detection: recent ejections, doubling the next one's length
    #: A provider's API (a hosted pool): no metrics to scrape, its own URL, model and key.
    hosted: HostedApi | None = None

    def is_ejected(self, now_s: float) -> bool:
        return now_s < self.ejected_until_s


class CandidateSet(tuple[EndpointState, ...]):
    """Every endpoint of the pools of `tier` that serve `model`, built with the pool view.

    A tuple, so routing plugins read it like any sequence of endpoints; it also says what all
    its members have in common, so the model and tier filters keep it whole without looking at
    each member, and it finds a member by URL in O(1) (the endpoints prefix affinity names).
    Built once per view, never per request.
    """

    model: str
    tier: Tier
    #: URL -> member (the first, should two pools list the same URL).
    by_url: Mapping[str, EndpointState]
    #: The members that are a provider's API (hosted pools): each takes only so many requests.
    providers: tuple[EndpointState, ...]
    #: Providers of the pools' endpoints left out for now, having as many requests open as
    #: their pool allows (`without_full_providers`): a request only they could serve waits.
    at_limit: tuple[EndpointState, ...]

    def __new__(
        cls,
        endpoints: Iterable[EndpointState],
        model: str,
        tier: Tier,
        providers: Iterable[EndpointState] = (),
        at_limit: Iterable[EndpointState] = (),
    ) -> CandidateSet:
        members = super().__new__(cls, endpoints)
        members.model, members.tier = model, tier
        members.providers = tuple(providers)
        members.at_limit = tuple(at_limit)
        by_url: dict[str, EndpointState] = {}
        for ep in members:
            by_url.setdefault(ep.url, ep)
        members.by_url = by_url
        return members

    def without_full_providers(self) -> CandidateSet:
        """The members but the providers that have as many requests open as their pool allows
        (`self` when none has: the usual case costs a look at the providers alone)."""
        full = {
            id(ep) for ep in self.providers if ep.hosted is not None and ep.hosted.full(ep.inflight)
        }
        if not full:
            return self
        return CandidateSet(
            (ep for ep in self if id(ep) not in full),
            self.model,
            self.tier,
            (ep for ep in self.providers if id(ep) not in full),
            (ep for ep in self.providers if id(ep) in full),
        )


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What routing policy may use about one request (never its text beyond a hash)."""

    model: str  # the requested (served) model name
    tier: Tier
    prompt_tokens: int
    max_output_tokens: int
    prefix_hashes: tuple[int, ...] = field(default=())  # hashes of the prompt's first blocks
    slo_ttft_s: float | None = None  # the request's latency targets (x-slo-ttft-ms, ...)
    slo_tpot_s: float | None = None
    #: Context one sequence needs: its prompt (estimated) and its output cap (else a token).
    context_tokens: int = 0
