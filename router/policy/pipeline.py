"""The routing pipeline: filters (a sampler among them) -> weighted scorers -> picker.

Built once from a `PolicyConfig`; `pick` runs on every request, so it only loops over the
candidates with plain floats and lists. The caller passes the view's `CandidateSet` for the
request's model and tier, which the model and tier filters keep without a scan; a sampler
(`random-sample` in the default policy) then bounds what the later filters, the scorers and
the picker see, so a request costs the same for a pool of 3 endpoints or of 300.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from typing import cast

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import (
    Filter,
    Picker,
    PluginContext,
    PoolShapes,
    Sampler,
    Scorer,
)
from tiergate.router.policy.config import PolicyConfig
from tiergate.router.policy.registry import build_plugin

__all__ = ["Pipeline"]


class Pipeline:
    """Filters, weighted scorers and a picker, applied in that order."""

    def __init__(
        self,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
    ) -> None:
        if any(weight <= 0 for _, weight in scorers):
            raise ValueError("scorer weights must be positive")
        self.filters = tuple(filters)
        self.scorers = tuple(scorer for scorer, _ in scorers)
        total = sum(weight for _, weight in scorers)
        # Normalised so the combined score stays in [0, 1], which the weighted-random picker
        # reads as a probability weight.
        self.weights = tuple(weight / total for _, weight in scorers)
        self.picker = picker
        # Only scorers that override `favoured_urls` can name any (prefix affinity does).
        self._favouring = tuple(
            s for s in self.scorers if type(s).favoured_urls is not Scorer.favoured_urls
        )

    @classmethod
    def from_config(
        cls,
        config: PolicyConfig,
        *,
        pools: Callable[[], PoolShapes] | None = None,
        rng: random.Random | None = None,
    ) -> Pipeline:
        """Build every plugin of `config`; PolicyConfigError names a plugin that cannot be built.

        pools: the pools' shapes now (deployment, batch cap), for latency prediction: the
            router's current view (default: no pool has a perf model).
        rng: the samplers' and pickers' randomness (default: seeded with 0, so runs are
            reproducible).
        """
        context = PluginContext(rng=rng if rng is not None else random.Random(0))
        if pools is not None:
            context = PluginContext(pools=pools, rng=context.rng)
        filters = [
            cast(Filter, build_plugin("filter", s.name, s.type, s.parameters, context))
            for s in config.filters
        ]
        scorers = [
            (
                cast(Scorer, build_plugin("scorer", s.name, s.type, s.parameters, context)),
                s.weight,
            )
            for s in config.scorers
        ]
        p = config.picker
        picker = cast(Picker, build_plugin("picker", p.name, p.type, p.parameters, context))
        return cls(filters, scorers, picker)

    def pick(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[EndpointState]:
        """The candidates that may serve `ctx`, best first (the rest are the retry order).

        Empty when there are none or the filters leave none; only a sampler's sample when
        there is one (which then is also all the retries can try).
        """
        if not candidates:  # a pool with no endpoints (scaled to zero), whatever the filters
            return []
        remaining = candidates
        for f in self.filters:
            if isinstance(f, Sampler):
                remaining = f.sample(ctx, remaining, self._favoured_urls(ctx), now_s)
            else:
                remaining = f.filter(ctx, remaining, now_s)
            if not remaining:
                return []
        if len(remaining) == 1:
            return [remaining[0]]
        totals = [0.0] * len(remaining)
        for scorer, weight in zip(self.scorers, self.weights, strict=True):
            scores = scorer.score(ctx, remaining, now_s)
            totals = [total + weight * value for total, value in zip(totals, scores, strict=True)]
        return self.picker.pick(remaining, totals)

    def _favoured_urls(self, ctx: RequestContext) -> Collection[str]:
        """URLs the scorers favour for `ctx`, which a sampler must keep (each once)."""
        favouring = self._favouring
        if len(favouring) <= 1:
            return favouring[0].favoured_urls(ctx) if favouring else ()
        urls: dict[str, None] = {}
        for scorer in favouring:
            urls.update(dict.fromkeys(scorer.favoured_urls(ctx)))
        return urls.keys()

    def observe(self, ctx: RequestContext, endpoint: EndpointState) -> None:
        """Tell stateful scorers that `endpoint` was chosen for `ctx`."""
        for scorer in self.scorers:
            scorer.observe(ctx, endpoint)
