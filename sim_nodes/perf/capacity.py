"""What one replica can carry at an SLO: the most concurrent streams at which steady-state
TTFT and TPOT both stay within their targets.

Shared by the planner (its steady-state prune) and the operator's autoscaler (replicas for
the observed load). Both latencies grow with the batch, so the largest such concurrency is
found by bisection between 1 and what the batch cap and KV cache allow.

`Resident` sequences (a sim node's background load) are what the engine keeps decoding beside
the requests: they hold batch slots and KV cache up front, so they come off both bounds, and
they are costed in every step as streams of the requests' shape (the steady-state model has
one shape; a background whose context and turns differ much from the requests' is
approximated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .deployment import Deployment
from .steady_state import Batching, PerfResult, Workload, evaluate, max_running

__all__ = ["Resident", "SloCapacity", "slo_capacity"]


@dataclass(frozen=True, slots=True)
class Resident:
    """Sequences the engine keeps in the batch besides the requests (the background)."""

    sequences: int = 0
    context_tokens: int = 0

    @property
    def kv_tokens(self) -> int:
        return self.sequences * self.context_tokens


@dataclass(frozen=True, slots=True)
class SloCapacity:
    """One replica's capacity at an SLO for one request shape."""

    #: The steady state at batch 1 (beside the resident sequences): the best latencies the
    #: replica can ever give (`fits` False: the model or one sequence's KV cache does not
    #: fit; nothing else is computed).
    alone: PerfResult
    #: Largest concurrency at which TTFT and TPOT meet their targets (0: not even batch 1).
    concurrency: int = 0
    #: The steady state at `concurrency` plus the resident sequences (None when it is 0).
    at_capacity: PerfResult | None = None
    #: Requests the batch cap and KV cache leave room for beside the resident sequences
    #: (0: none; then `alone` is the replica without them, and `fits` says whether the
    #: model itself does).
    room: int = 0

    @property
    def requests_per_s(self) -> float:
        """Requests one replica completes per second at `concurrency` (0 when none), the
        resident sequences' share of the throughput left out."""
        r = self.at_capacity
        if r is None:
            return 0.0
        share = self.concurrency / r.concurrency
        return share * r.throughput_output_tokens_per_s / r.output_tokens


def slo_capacity(
    d: Deployment,
    shape: Workload,
    batching: Batching,
    ttft_s: float | None,
    tpot_s: float | None,
    resident: Resident | None = None,
) -> SloCapacity:
    """`d`'s capacity for requests of `shape` (its concurrency is ignored) under targets
    `ttft_s` and `tpot_s` (None: no target; both None: as many streams as fit), beside
    `resident` sequences (None: none)."""
    ttft_limit = math.inf if ttft_s is None else ttft_s
    tpot_limit = math.inf if tpot_s is None else tpot_s
    bg = resident or Resident()
    room = _room(d, shape, batching, bg)
    if room < 1:
        return SloCapacity(evaluate(d, _at(shape, 1), batching))
    alone = evaluate(d, _at(shape, 1 + bg.sequences), batching)
    if not alone.fits:
        return SloCapacity(alone, room=room)

    def meets(c: int) -> PerfResult | None:
        r = alone if c == 1 else evaluate(d, _at(shape, c + bg.sequences), batching)
        return r if r.fits and r.ttft_s <= ttft_limit and r.tpot_s <= tpot_limit else None

    if meets(1) is None:
        return SloCapacity(alone, room=room)
    low, high = 1, room
    best = alone
    while low < high:
        mid = (low + high + 1) // 2
        found = meets(mid)
        if found is None:
            high = mid - 1
        else:
            low, best = mid, found
    return SloCapacity(alone, low, best, room)


def _room(d: Deployment, shape: Workload, batching: Batching, resident: Resident) -> int:
    """Requests that fit beside `resident`: the batch slots and KV cache it leaves."""
    if not resident.sequences:
        return max_running(d, _at(shape, None), batching)
    free_kv_tokens = max(d.kv_capacity_tokens - resident.kv_tokens, 0)
    room = free_kv_tokens // max(shape.tokens_per_sequence, 1)
    if batching.max_num_seqs is not None:
        room = min(room, batching.max_num_seqs - resident.sequences)
    return max(room, 0)


def _at(shape: Workload, concurrency: int | None) -> Workload:
    return Workload(shape.input_tokens, shape.output_tokens, shape.cached_input_tokens, concurrency)
