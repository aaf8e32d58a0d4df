"""`model-filter`: keep endpoints whose pool serves the requested model name."""

from __future__ import annotations

from collections.abc import Sequence

from ..state import EndpointState, RequestContext
from .base import Filter, NoParameters, PluginContext
from .registry import register

__all__ = ["ModelFilter"]


@register("model-filter", NoParameters)
class ModelFilter(Filter):
    """Drops endpoints that do not serve `ctx.model` (under any of their served names)."""

    def __init__(self, name: str, parameters: NoParameters, context: PluginContext) -> None:
        super().__init__(name, parameters, context)

    def filter(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> Sequence[EndpointState]:
        model = ctx.model
        if all(model in ep.served_names for ep in candidates):
            return candidates  # the usual case (pre-indexed candidates): no copy
        return [ep for ep in candidates if model in ep.served_names]
