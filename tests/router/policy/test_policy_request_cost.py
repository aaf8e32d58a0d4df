"""A request's routing work is bounded by the sample, not by the pool.

Endpoints that count every read of their fields show which ones a request touched: for a
pool of 300, admission's saturation check and the default pipeline touch at most the sample
size plus the endpoints prefix affinity favours, and each scorer scores no more than that.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from policy_helpers import request

from tiergate.router.admission import Saturation
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import PoolView, build_view
from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.policy import FixedPools, Pipeline, default_policy, prefix_hashes
from tiergate.sim_nodes.catalogs import default_catalog

SAMPLE_SIZE = 8  # the default policy's random-sample size
MODEL = "coder"


class Counted(EndpointState):
    """An endpoint that records, in `touched`, that some code read one of its fields."""

    touched: set[int] = set()  # shared on purpose: one record for every instance

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            Counted.touched.add(id(self))
        return super().__getattribute__(name)


def view_of(n: int) -> PoolView:
    """One batched pool of `n` counted endpoints serving MODEL."""
    urls = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(n)]
    config = parse_config(
        json.dumps(
            {
                "pools": [
                    {
                        "name": "big",
                        "tier": "batched",
                        "model": "llama-3.1-8b",
                        "servedModelName": MODEL,
                        "accelerator": "h100-sxm",
                        "batching": {"maxNumSeqs": 64},
                        "endpoints": urls,
                    }
                ]
            }
        )
    )
    built = build_view(config.pools, default_catalog())
    pool = built.pools["big"]
    counted = tuple(
        Counted(e.url, e.pool, e.tier, e.model, e.served_names, running=float(i % 7), waiting=0.0)
        for i, e in enumerate(pool.endpoints)
    )
    return PoolView([dataclasses.replace(pool, endpoints=counted)])


def test_a_request_touches_the_sample_and_the_favoured_endpoints_only() -> None:
    view = view_of(300)
    deployments = {name: p.deployment for name, p in view.pools.items() if p.deployment}
    pipeline = Pipeline.from_config(default_policy(), pools=FixedPools(deployments).now)
    seen_by_scorers: list[int] = []
    for scorer in pipeline.scorers:
        score = scorer.score

        def counting(
            ctx: RequestContext,
            candidates: Sequence[EndpointState],
            now_s: float,
            score: Any = score,
        ) -> list[float]:
            seen_by_scorers.append(len(candidates))
            return list(score(ctx, candidates, now_s))

        scorer.score = counting  # type: ignore[method-assign]
    saturation = Saturation()
    saturation.refresh(view)  # after a scrape round: visits every endpoint, once
    prompts = [f"system prompt {i} " * 200 for i in range(5)]
    favoured_seen = 0
    for i in range(200):
        ctx = request(MODEL, prefix_hashes=prefix_hashes(prompts[i % 5]))
        Counted.touched.clear()
        seen_by_scorers.clear()
        assert not saturation.is_saturated(view, MODEL, "batched")
        order = pipeline.pick(ctx, view.candidates(MODEL, "batched"), 0.0)
        favoured = len(pipeline._favoured_urls(ctx))
        favoured_seen = max(favoured_seen, favoured)
        bound = SAMPLE_SIZE + favoured
        assert len(Counted.touched) <= bound, (i, len(Counted.touched), bound)
        assert len(seen_by_scorers) == len(pipeline.scorers)
        assert max(seen_by_scorers) <= bound
        assert 0 < len(order) <= bound
        pipeline.observe(ctx, order[0])
    # The prompts repeat, so affinity did favour endpoints (and they were kept).
    assert favoured_seen >= 1


def test_the_favoured_endpoint_wins_when_loads_are_equal() -> None:
    # Quality: the sample keeps the endpoint with the warm prefix, so affinity still decides
    # between otherwise equal endpoints however large the pool.
    view = view_of(300)
    for ep in view.endpoints():
        ep.running = 0.0
    pipeline = Pipeline.from_config(
        default_policy(),
        pools=FixedPools({n: p.deployment for n, p in view.pools.items() if p.deployment}).now,
    )
    ctx = request(MODEL, prefix_hashes=prefix_hashes("a long shared system prompt " * 100))
    warm = view.candidates(MODEL, "batched")[123]
    pipeline.observe(ctx, warm)
    for _ in range(20):
        assert pipeline.pick(ctx, view.candidates(MODEL, "batched"), 0.0)[0] is warm


def test_saturation_is_read_per_request_and_worked_out_per_refresh() -> None:
    view = view_of(300)
    saturation = Saturation(threshold=8.0)
    assert not saturation.is_saturated(view, MODEL, "batched")  # a new view: refreshed
    for ep in view.endpoints():
        ep.waiting = 9.0
    Counted.touched.clear()
    # Metrics changed, but only a refresh (after the scrape round) reads them.
    assert not saturation.is_saturated(view, MODEL, "batched")
    assert not Counted.touched
    saturation.refresh(view)
    assert saturation.is_saturated(view, MODEL, "batched")
    assert not saturation.is_saturated(view, "other-model", "batched")
