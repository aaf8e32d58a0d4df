"""The routing pipeline: filters -> weighted scorers -> picker.

Built once from a `PolicyConfig`; `pick` runs on every request, so it only loops over the
candidates with plain floats and lists. The caller narrows candidates first (the app indexes
endpoints by model and tier), so the cost follows the endpoints that can serve the request,
not the size of the fleet.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import cast

from tiergate.sim_nodes.perf import Deployment

from ..state import EndpointState, RequestContext
from .base import Filter, Picker, PluginContext, Scorer
from .config import PolicyConfig
from .registry import build_plugin

__all__ = ["Pipeline"]


class Pipeline:
    """Filters, weighted scorers and a picker, applied in that order."""

    def __init__(
        self,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        *,
        max_candidates: int = 64,
        rng: random.Random | None = None,
    ) -> None:
        """`max_candidates`: more endpoints than this after filtering are sampled down to it
        (with `rng`) before scoring, so a huge pool costs no more per request than this many."""
        if any(weight <= 0 for _, weight in scorers):
            raise ValueError("scorer weights must be positive")
        if max_candidates < 1:
            raise ValueError("max_candidates must be at least 1")
        self.max_candidates = max_candidates
        self.rng = rng if rng is not None else random.Random(0)
        self.filters = tuple(filters)
        self.scorers = tuple(scorer for scorer, _ in scorers)
        total = sum(weight for _, weight in scorers)
        # Normalised so the combined score stays in [0, 1], which the weighted-random picker
        # reads as a probability weight.
        self.weights = tuple(weight / total for _, weight in scorers)
        self.picker = picker

    @classmethod
    def from_config(
        cls,
        config: PolicyConfig,
        *,
        deployments: Mapping[str, Deployment] | None = None,
        batch_caps: Mapping[str, int] | None = None,
        rng: random.Random | None = None,
    ) -> Pipeline:
        """Build every plugin of `config`; PolicyConfigError names a plugin that cannot be built.

        deployments / batch_caps: pool name -> Deployment / max_num_seqs, for latency prediction.
        rng: the pickers' randomness (default: seeded with 0, so runs are reproducible).
        """
        context = PluginContext(
            deployments=deployments if deployments is not None else {},
            batch_caps=batch_caps if batch_caps is not None else {},
            rng=rng if rng is not None else random.Random(0),
        )
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
        return cls(filters, scorers, picker, max_candidates=config.max_candidates, rng=context.rng)

    def pick(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[EndpointState]:
        """The candidates that may serve `ctx`, best first (the rest are the retry order).

        Empty when the filters leave none. With more than `max_candidates` left, only a random
        sample of that many is scored and returned.
        """
        remaining = candidates
        for f in self.filters:
            remaining = f.filter(ctx, remaining, now_s)
            if not remaining:
                return []
        if len(remaining) == 1:
            return [remaining[0]]
        if len(remaining) > self.max_candidates:
            # Power-of-k-choices: a random sample balances load almost as well as scoring all
            # (the classic two-choices result), at a cost that stops growing with the pool.
            remaining = self.rng.sample(remaining, self.max_candidates)
        totals = [0.0] * len(remaining)
        for scorer, weight in zip(self.scorers, self.weights, strict=True):
            scores = scorer.score(ctx, remaining, now_s)
            totals = [total + weight * value for total, value in zip(totals, scores, strict=True)]
        return self.picker.pick(remaining, totals)

    def observe(self, ctx: RequestContext, endpoint: EndpointState) -> None:
        """Tell stateful scorers that `endpoint` was chosen for `ctx`."""
        for scorer in self.scorers:
            scorer.observe(ctx, endpoint)
