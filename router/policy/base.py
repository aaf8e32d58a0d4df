"""The three kinds of routing plugin and what they are built with.

A request's candidates go through every `Filter` in order, then every `Scorer` scores the
survivors in [0, 1] (1 = best) and the `Picker` orders them by the weighted sum. A `Sampler`
is a filter that keeps a bounded subset, so that what comes after it costs the same for a pool
of 3 or of 300 endpoints; the pipeline tells it which endpoints the scorers favour
(`Scorer.favoured_urls`) so the sample never loses them. Plugins are built once from
configuration and called on the request path, so they must be cheap: no I/O, no clock reads
(the pipeline passes `now_s`), no pydantic objects per request, and nothing that visits every
endpoint of a large pool (the candidates may be a `CandidateSet`: see the model filter).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from tiergate.router.base.tiers import Tier
from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.sim_nodes.perf import Deployment

__all__ = [
    "Filter",
    "FixedPools",
    "NoEndpointFits",
    "NoParameters",
    "Parameters",
    "Picker",
    "Plugin",
    "PluginContext",
    "PluginKind",
    "PoolShapes",
    "Sampler",
    "Scorer",
    "holding",
]

PluginKind = Literal["filter", "scorer", "picker"]


class Parameters(BaseModel):
    """Base of every plugin's parameters: unknown keys are an error, values are frozen.

    Keys may be snake_case or camelCase, as everywhere else in the YAML configuration.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        allow_inf_nan=False,
    )


class NoParameters(Parameters):
    """For plugins that take no parameters."""


class PoolShapes(Protocol):
    """What latency prediction reads of each pool: the router's pool view is one (computed
    once per view), `FixedPools` another."""

    def deployment(self, pool: str) -> Deployment | None:
        """The replica the pool's ServingSpec describes; None: no perf model for it."""
        ...

    def batch_cap(self, pool: str) -> int | None:
        """Requests one endpoint of the pool takes at once; None: uncapped."""
        ...

    def context(self, pool: str) -> int | None:
        """The longest context the pool's engines serve; None: unknown."""
        ...

    def shortest_context(self, model: str, tier: Tier) -> int | None:
        """At most the shortest `context` of the pools whose endpoints serve `model` in `tier`
        (None: not known; `context-filter` then looks at each endpoint)."""
        ...


def holding(
    pools: PoolShapes, endpoints: Sequence[EndpointState], model: str, tier: Tier, tokens: int
) -> Sequence[EndpointState]:
    """Of `endpoints` (serving `model` in `tier`), those whose pool's context holds `tokens`
    (a pool of unknown context does): all of them, without a look at each, when the shortest
    context of the tier's pools does (the common case)."""
    shortest = pools.shortest_context(model, tier)
    if shortest is not None and tokens <= shortest:
        return endpoints
    return [e for e in endpoints if (context := pools.context(e.pool)) is None or context >= tokens]


@dataclass(frozen=True, slots=True)
class FixedPools:
    """Pool shapes that never change (tests, benchmarks)."""

    deployments: Mapping[str, Deployment] = field(default_factory=dict)
    batch_caps: Mapping[str, int] = field(default_factory=dict)

    def deployment(self, pool: str) -> Deployment | None:
        return self.deployments.get(pool)

    def batch_cap(self, pool: str) -> int | None:
        return self.batch_caps.get(pool)

    def context(self, pool: str) -> int | None:
        d = self.deployments.get(pool)
        return d.model.max_context_tokens if d is not None else None

    def shortest_context(self, model: str, tier: Tier) -> int | None:
        """The shortest of every pool's here (which serve `model` is not known: that of any
        pool is at most theirs)."""
        contexts = [d.model.max_context_tokens for d in self.deployments.values()]
        return min(contexts) if contexts else None

    def now(self) -> FixedPools:
        """Itself: the `pools` callable of a context that never changes."""
        return self


_NO_POOLS = FixedPools()


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What plugins may be built with besides their parameters.

    pools: the pools' shapes now (for latency prediction), read on every prediction so that
        a reloaded view is seen at once; the router passes its current view.
    rng: the only source of randomness, seeded by whoever builds the pipeline.
    """

    pools: Callable[[], PoolShapes] = _NO_POOLS.now
    rng: random.Random = field(default_factory=lambda: random.Random(0))


class Plugin(ABC):
    """A named, configured plugin instance."""

    kind: ClassVar[PluginKind]
    #: Set by `registry.register`: the kebab-case type name used in configuration.
    type_name: ClassVar[str] = ""

    def __init__(self, name: str, parameters: Any, context: PluginContext) -> None:
        # `parameters` is the plugin's own Parameters subclass, validated by the registry;
        # subclasses narrow the annotation.
        self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class NoEndpointFits(Exception):
    """A filter's refusal of a request no candidate can serve as it asks (not merely "none is
    available"): the router answers 503 with `message` and `code`."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message, self.code = message, code


class Filter(Plugin):
    """Drops candidates that must not serve the request; may raise `NoEndpointFits`."""

    kind = "filter"

    @abstractmethod
    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        """The candidates to keep, in their given order (the input itself if all are kept)."""


class Scorer(Plugin):
    """Rates candidates in [0, 1], 1 being the best."""

    kind = "scorer"

    @abstractmethod
    def score(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[float]:
        """One score per candidate, aligned with `candidates`."""

    def observe(self, ctx: RequestContext, endpoint: EndpointState) -> None:
        """Learn that `endpoint` was chosen for `ctx` (stateful scorers override this)."""

    def favoured_urls(self, ctx: RequestContext) -> Collection[str]:
        """URLs of the endpoints this scorer would rate above 0 for `ctx`, if it knows them
        without looking at the candidates (in O(1) of the pool's size); a `Sampler` keeps them.

        Empty by default: most scores depend on every candidate's state, not on the request.
        """
        return ()


class Sampler(Filter):
    """A filter keeping a bounded subset of the candidates, plus the ones scorers favour."""

    @abstractmethod
    def sample(
        self,
        ctx: RequestContext,
        candidates: Sequence[EndpointState],
        favoured_urls: Collection[str],
        now_s: float,
    ) -> Sequence[EndpointState]:
        """A subset of `candidates` that keeps every candidate whose URL is favoured."""

    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        """`sample` with nothing favoured (the pipeline calls `sample` itself)."""
        return self.sample(ctx, candidates, (), now_s)


class Picker(Plugin):
    """Orders the scored candidates: the first is chosen, the rest are the retry order."""

    kind = "picker"

    @abstractmethod
    def pick(
        self, candidates: Sequence[EndpointState], scores: Sequence[float]
    ) -> list[EndpointState]:
        """All candidates, most preferred first."""
