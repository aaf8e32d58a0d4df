"""Admission and fairness: one priority queue per tier in front of its endpoints.

Each tier admits at most `capacity` requests at once (the batch caps of its endpoints, plus
some headroom so their own queues never run dry). Beyond that, requests wait at the router
in priority order: premium before standard before flex, first come first served within a
priority. The wait queue is bounded; when it is full, the lowest-priority, latest request is
shed (429 with Retry-After), which may be a waiter already queued, so a premium request
arriving at a full batched-tier queue displaces a flex one rather than being refused.

A tier is also *saturated* when every endpoint reports (vLLM metrics) at least
`saturation_waiting` queued requests: that catches load the router does not see (other
clients of the nodes). Flex requests are shed at once from a saturated tier.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import RouterError
from .state import EndpointState
from .tiers import Priority

PRIORITY_RANK: dict[Priority, int] = {"premium": 0, "standard": 1, "flex": 2}


class Shed(Exception):
    """This request was shed by admission control."""


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)


class TierQueue:
    """Admission for one tier."""

    def __init__(self, tier: str, capacity: int, max_waiting: int) -> None:
        self.tier = tier
        self.capacity = max(capacity, 1)
        self.max_waiting = max_waiting
        self.active = 0
        self._waiters: list[_Waiter] = []  # a heap: best (rank, seq) first
        self._seq = itertools.count()
        self.shed_count = 0

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())

    async def acquire(self, priority: Priority) -> None:
        """Wait for a slot; raises Shed if this request is shed (now or while waiting)."""
        if self.active < self.capacity and not self._waiters:
            self.active += 1
            return
        rank = PRIORITY_RANK[priority]
        if len(self._waiters) >= self.max_waiting:
            worst = max(self._waiters)
            if (rank, math.inf) >= (worst.rank, worst.seq):
                self.shed_count += 1
                raise Shed
            self._waiters.remove(worst)
            heapq.heapify(self._waiters)
            self.shed_count += 1
            worst.future.set_exception(Shed())
        waiter = _Waiter(rank, next(self._seq), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiters, waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                if waiter.future.exception() is None:  # given a slot as we went away
                    self.release()
            else:
                self._discard(waiter)
            raise

    def release(self) -> None:
        self.active -= 1
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters and self.active < self.capacity:
            waiter = heapq.heappop(self._waiters)
            if waiter.future.done():
                continue
            self.active += 1
            waiter.future.set_result(None)

    def _discard(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            heapq.heapify(self._waiters)


def saturated(endpoints: Sequence[EndpointState], threshold: float) -> bool:
    """Every endpoint reports at least `threshold` waiting requests (unknown = not)."""
    return bool(endpoints) and all(
        e.waiting is not None and e.waiting >= threshold for e in endpoints
    )


def shed_error(tier: str, retry_after_s: int) -> RouterError:
    return RouterError(
        429,
        f"the {tier} tier is saturated; retry later or use another tier",
        type="rate_limit_error",
        code="tier_saturated",
        headers={"Retry-After": str(max(1, retry_after_s))},
    )
