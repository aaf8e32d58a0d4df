"""`weighted-random-picker`: choose with probability proportional to the combined score."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tiergate.router.endpoints.state import EndpointState
from tiergate.router.policy.base import NoParameters, Picker, PluginContext
from tiergate.router.policy.registry import register

__all__ = ["WeightedRandomPicker"]


@register("weighted-random-picker", NoParameters)
class WeightedRandomPicker(Picker):
    """Weighted sampling without replacement (Efraimidis-Spirakis): each candidate draws
    log(u) / score and the largest keys come first, so the first pick has probability
    score / sum(scores) and the rest give a retry order following the same weights.

    Spreads load where max-score would herd onto one endpoint between metric scrapes.
    Zero scores come last, in random order; if every score is zero the order is uniform.
    """

    def __init__(self, name: str, parameters: NoParameters, context: PluginContext) -> None:
        super().__init__(name, parameters, context)
        self.rng = context.rng

    def pick(
        self, candidates: Sequence[EndpointState], scores: Sequence[float]
    ) -> list[EndpointState]:
        draw = self.rng.random
        keys: list[tuple[float, float]] = []
        for score in scores:
            u = 1.0 - draw()  # in (0, 1]: log is finite
            if score > 0:
                keys.append((math.log(u) / score, 0.0))
            else:
                # Below every positive-score key; u orders the zero-score ones among themselves.
                keys.append((-math.inf, u))
        order = sorted(range(len(candidates)), key=keys.__getitem__, reverse=True)
        return [candidates[i] for i in order]
