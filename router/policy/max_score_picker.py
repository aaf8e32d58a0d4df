"""`max-score-picker`: highest combined score first, ties broken at random (seeded)."""

from __future__ import annotations

from collections.abc import Sequence

from tiergate.router.endpoints.state import EndpointState
from tiergate.router.policy.base import NoParameters, Picker, PluginContext
from tiergate.router.policy.registry import register

__all__ = ["MaxScorePicker"]


@register("max-score-picker", NoParameters)
class MaxScorePicker(Picker):
    """All candidates by descending score; equal scores in random order.

    Random tie-breaking matters: with identical endpoints (one pool, no load yet) a fixed
    order would send every request to the first one.
    """

    def __init__(self, name: str, parameters: NoParameters, context: PluginContext) -> None:
        super().__init__(name, parameters, context)
        self.rng = context.rng

    def pick(
        self, candidates: Sequence[EndpointState], scores: Sequence[float]
    ) -> list[EndpointState]:
        n = len(candidates)
        if len(set(scores)) == n:
            # No ties (the usual case with continuous scores): no random draws needed.
            order = sorted(range(n), key=scores.__getitem__, reverse=True)
        else:
            draw = self.rng.random
            order = sorted(range(n), key=lambda i: (-scores[i], draw()))
        return [candidates[i] for i in order]
