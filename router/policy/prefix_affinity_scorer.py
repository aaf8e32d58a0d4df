"""`prefix-affinity-scorer`: send a prompt where its leading blocks were recently sent.

The router cannot see the engines' prefix caches, so it remembers where it sent each prefix
(the cumulative block hashes of `prefix_hashes`) in an LRU table bounded by `capacity`
block hashes. An endpoint scores the fraction of the request's leading blocks it served
recently: a request whose first 6 of 8 blocks went to endpoint A scores A 0.75. Which
endpoints those are follows from the table alone (`favoured_urls`), so a `random-sample` stage
keeps them in its sample however large the pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from pydantic import Field

from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy.base import Parameters, PluginContext, Scorer
from tiergate.router.policy.registry import register

__all__ = ["PrefixAffinityParameters", "PrefixAffinityScorer"]


class PrefixAffinityParameters(Parameters):
    capacity: int = Field(
        default=65536,
        ge=1,
        le=1_048_576,
        description="Block hashes remembered (least recently used go).",
    )
    endpoints_per_block: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Endpoints remembered per block hash (most recent kept).",
    )


@register("prefix-affinity-scorer", PrefixAffinityParameters)
class PrefixAffinityScorer(Scorer):
    """Fraction of the request's leading blocks each endpoint served recently."""

    def __init__(
        self, name: str, parameters: PrefixAffinityParameters, context: PluginContext
    ) -> None:
        super().__init__(name, parameters, context)
        self.capacity = parameters.capacity
        self.endpoints_per_block = parameters.endpoints_per_block
        # block hash -> endpoint URLs that served it, oldest first; the table itself in LRU
        # order (least recently observed first).
        self._table: OrderedDict[int, list[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def score(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[float]:
        matched = self._matched(ctx)
        if not matched:
            return [0.0] * len(candidates)
        blocks = len(ctx.prefix_hashes)
        return [matched.get(ep.url, 0) / blocks for ep in candidates]

    def favoured_urls(self, ctx: RequestContext) -> Collection[str]:
        """The endpoints that served a leading block of this prompt (at most
        `endpoints_per_block`): a few hash lookups, whatever the size of the pool."""
        return self._matched(ctx).keys()

    def _matched(self, ctx: RequestContext) -> dict[str, int]:
        """URL -> leading blocks of `ctx`'s prompt it served recently (absent: none)."""
        hashes = ctx.prefix_hashes
        if not hashes or not self._table:
            return {}
        # matched[url] = leading blocks matched so far; an endpoint only extends its run if it
        # matched every earlier block, so the score is a true leading-prefix fraction.
        matched: dict[str, int] = {}
        table = self._table
        for i, block in enumerate(hashes):
            urls = table.get(block)
            if not urls:
                break
            extended = False
            for url in urls:
                if matched.get(url, 0) == i:
                    matched[url] = i + 1
                    extended = True
            if not extended:
                break
        return matched

    def observe(self, ctx: RequestContext, endpoint: EndpointState) -> None:
        table, url = self._table, endpoint.url
        for block in ctx.prefix_hashes:
            urls = table.get(block)
            if urls is None:
                table[block] = [url]
            else:
                table.move_to_end(block)
                if url in urls:
                    urls.remove(url)
                urls.append(url)
                if len(urls) > self.endpoints_per_block:
                    del urls[0]
        while len(table) > self.capacity:
            table.popitem(last=False)
