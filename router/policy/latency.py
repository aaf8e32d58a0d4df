"""Predicted latency of one request on one endpoint, from the perf model and the endpoint's load.

The endpoint's last scrape says how many sequences run and wait there; the pool's
`Deployment` says what a step costs. For a new request, with `load` sequences ahead of it:

    batch  = min(load + 1, batch cap)          the step it decodes in
    queued = max(load + 1 - batch cap, 0)      sequences that must finish before it starts
    TPOT   = decode step(batch) / tokens per step (speculative decoding emits several)
    TTFT   = queued / cap * one request's duration + prefill step(prompt, batch - 1 decoding)
    total  = TTFT + (output - 1) * TPOT

The other sequences' contexts are unknown, so they are assumed shaped like this request (or
`other_context_tokens`). It is a ranking signal and an SLO estimate, not a simulation: it runs
on the request path, so step costs are cached per pool on a grid of token counts rounded up to
4 significant bits (at most 1/8 too high) instead of asking the perf model each time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tiergate.router.endpoints.state import EndpointState
from tiergate.router.policy.base import PoolShapes
from tiergate.sim_nodes.perf import Deployment, step_terms

__all__ = ["LatencyEstimate", "LatencyPredictor", "endpoint_load"]

#: Cached step costs per pool before the cache is dropped and refilled (keeps memory bounded
#: under adversarial token counts; the grid makes real traffic hit far fewer entries).
_MAX_ENTRIES_PER_POOL = 8192


@dataclass(frozen=True, slots=True)
class LatencyEstimate:
    """Predicted times for one request on one endpoint, seconds."""

    ttft_s: float
    tpot_s: float
    total_s: float


@dataclass(slots=True)
class _PoolSteps:
    deployment: Deployment
    tokens_per_step: float
    # (batch, other context, prompt) on the grid -> (prefill step s, time per output token s)
    times: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)


def endpoint_load(ep: EndpointState) -> float:
    """Sequences ahead of a new request: running + waiting from the last scrape, or the
    router's own in-flight count when that is higher (requests routed since the scrape)."""
    scraped = (ep.running or 0.0) + (ep.waiting or 0.0)
    return max(scraped, float(ep.inflight))


def _grid(n: float) -> int:
    """`n` rounded up to 4 significant bits (exact below 16)."""
    i = max(math.ceil(n), 0)
    if i < 16:
        return i
    shift = i.bit_length() - 4
    return ((i + (1 << shift) - 1) >> shift) << shift


class LatencyPredictor:
    """Predicts latency per pool; pure apart from its cache. Not thread-safe (one event loop).

    `pools` gives the pools' shapes now (the router's current view) and is read on every call,
    so a reloaded view is seen at once; a pool whose Deployment changed gets a fresh cache.
    """

    def __init__(
        self, pools: Callable[[], PoolShapes], *, other_context_tokens: int | None = None
    ) -> None:
        self.pools = pools
        self.other_context_tokens = other_context_tokens
        self._pools: dict[str, _PoolSteps] = {}

    def predict(
        self, pool: str, load: float, prompt_tokens: int, output_tokens: int
    ) -> LatencyEstimate | None:
        """Latency of a request on an endpoint of `pool` with `load` sequences ahead.

        None when the pool has no Deployment (unknown to the perf model).
        """
        prompt, output = max(prompt_tokens, 1), max(output_tokens, 1)
        context = self.other_context_tokens or prompt + output // 2
        times = self._times(self.pools(), pool, load, _grid(prompt), _grid(context), output)
        if times is None:
            return None
        ttft_s, tpot_s = times
        return LatencyEstimate(ttft_s=ttft_s, tpot_s=tpot_s, total_s=ttft_s + (output - 1) * tpot_s)

    def totals(
        self, endpoints: Sequence[EndpointState], prompt_tokens: int, output_tokens: int
    ) -> list[float | None]:
        """Predicted total seconds of one request on each endpoint (None: no perf model).

        The request-path form of `predict`: the request's grid point is computed once and no
        object is created per endpoint.
        """
        prompt, output = max(prompt_tokens, 1), max(output_tokens, 1)
        context = _grid(self.other_context_tokens or prompt + output // 2)
        prompt_grid, decode_tokens = _grid(prompt), output - 1
        times, shapes = self._times, self.pools()
        totals: list[float | None] = []
        for ep in endpoints:
            load = (ep.running or 0.0) + (ep.waiting or 0.0)
            if ep.inflight > load:
                load = float(ep.inflight)
            found = times(shapes, ep.pool, load, prompt_grid, context, output)
            totals.append(None if found is None else found[0] + decode_tokens * found[1])
        return totals

    def _refresh(
        self,
        shapes: PoolShapes,
        pool: str,
        steps: _PoolSteps | None,
        deployment: Deployment | None,
    ) -> _PoolSteps | None:
        """The pools changed (a new view): `pool`'s cache for `deployment`, and none for pools
        that are gone. Every view builds new Deployment objects, so an equal one keeps the
        cache; only a pool whose hardware or model changed starts over."""
        for gone in [name for name in self._pools if shapes.deployment(name) is None]:
            del self._pools[gone]
        if deployment is None:
            return None
        if steps is not None and steps.deployment == deployment:
            steps.deployment = deployment
            return steps
        spec = deployment.speculative
        steps = _PoolSteps(deployment, spec.tokens_per_step if spec else 1.0)
        self._pools[pool] = steps
        return steps

    def _times(
        self, shapes: PoolShapes, pool: str, load: float, prompt: int, context: int, output: int
    ) -> tuple[float, float] | None:
        """(TTFT s, TPOT s) with `prompt` and `context` already on the grid."""
        steps = self._pools.get(pool)
        deployment = shapes.deployment(pool)
        if steps is None or steps.deployment is not deployment:
            steps = self._refresh(shapes, pool, steps, deployment)
            if steps is None:
                return None
        cap = shapes.batch_cap(pool)
        batch = load + 1.0
        queued = 0.0
        if cap is not None and batch > cap:
            queued, batch = batch - cap, float(cap)
        b = _grid(batch)
        key = (b, context, prompt)
        cached = steps.times.get(key)
        if cached is None:
            cached = _step_times(steps, b, context, prompt)
            if len(steps.times) >= _MAX_ENTRIES_PER_POOL:
                steps.times.clear()
            steps.times[key] = cached
        prefill_s, tpot_s = cached
        if queued and cap:
            # Each of the `cap` slots frees after about one request's duration; a queued
            # request waits for `queued` of them to free.
            return queued / cap * (prefill_s + (output - 1) * tpot_s) + prefill_s, tpot_s
        return prefill_s, tpot_s


def _step_times(steps: _PoolSteps, batch: int, context: int, prompt: int) -> tuple[float, float]:
    """(prefill step with batch - 1 others decoding, decode step / tokens per step)."""
    d = steps.deployment
    decode = step_terms(d, decode_seqs=batch, decode_context_tokens=batch * context)
    others = batch - 1
    prefill = step_terms(
        d,
        decode_seqs=others,
        decode_context_tokens=others * context,
        prefill_tokens=prompt,
        prefill_attended_positions=prompt * (prompt + 1) / 2,
    )
    return prefill.total_s, decode.total_s / steps.tokens_per_step
