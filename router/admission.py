"""Admission and fairness: one priority queue per tier in front of its endpoints.

Each tier admits at most `capacity` requests at once (the batch caps of its endpoints, plus
some headroom so their own queues never run dry). Beyond that, requests wait at the router
in priority order: premium before standard before flex, first come first served within a
priority. The wait queue is bounded; when it is full, the lowest-priority, latest request is
shed (429 with Retry-After), which may be a waiter already queued, so a premium request
arriving at a full batched-tier queue displaces a flex one rather than being refused.

A tier is also *saturated* when every endpoint reports (vLLM metrics) at least
`SATURATION_WAITING` queued requests: that catches load the router does not see (other
clients of the nodes). Flex requests are shed at once from a saturated tier. Those figures
change only when the scraper writes them, so `Saturation` works the flags out after each
scrape round and for each new view, and a request reads one flag instead of every endpoint.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import get_args

from tiergate.router.discovery.state import EndpointState
from tiergate.router.discovery.view import PoolView
from tiergate.router.http.errors import RouterError
from tiergate.router.request.tiers import TIERS, Priority, Tier

#: Priorities in the order they are served (sim_nodes/tiers.py `Priority`).
PRIORITY_RANK: dict[Priority, int] = {p: rank for rank, p in enumerate(get_args(Priority))}
#: Per-endpoint waiting requests beyond which a tier counts as saturated.
SATURATION_WAITING = 8.0
#: Router-side in-flight headroom over the endpoints' batch caps (keeps their queues fed).
HEADROOM = 1.5


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

    def resize(self, capacity: int, max_waiting: int) -> None:
        """New limits (the tier's endpoints changed); waiters get the slots a larger
        capacity frees at once, not when a running request ends. Nothing admitted or waiting
        is shed by a smaller one: it takes effect as requests end."""
        self.capacity = max(capacity, 1)
        self.max_waiting = max_waiting
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


class Saturation:
    """Which (model, tier) candidate sets are saturated, as of the last `refresh`.

    Refreshed after every scrape round (the scraper is what changes the waiting counts) and
    whenever it is asked about another view than the one it last saw (pools or endpoints
    changed), so the answer is never older than a scrape round. Each refresh visits every
    endpoint once; a request only looks its (model, tier) up.
    """

    def __init__(self, threshold: float = SATURATION_WAITING) -> None:
        self.threshold = threshold
        self._view: PoolView | None = None
        self._saturated: frozenset[tuple[str, Tier]] = frozenset()

    def refresh(self, view: PoolView) -> None:
        """Work the flags out again from `view`'s endpoints' current metrics."""
        self._view = view
        self._saturated = frozenset(
            (members.model, members.tier)
            for members in view.candidate_sets()
            if saturated(members, self.threshold)
        )

    def is_saturated(self, view: PoolView, model: str, tier: Tier) -> bool:
        """Whether every endpoint of `tier` serving `model` was saturated at the last refresh."""
        if view is not self._view:
            self.refresh(view)
        return (model, tier) in self._saturated


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


class Admission:
    """Every tier's queue, sized from the view's batch caps, and the saturation flags.

    `on_shed(tier, priority)` is told of each request shed (a metric)."""

    def __init__(self, saturation: Saturation, on_shed: Callable[[Tier, Priority], None]) -> None:
        self.saturation = saturation
        self.queues: dict[Tier, TierQueue] = {}
        self._on_shed = on_shed

    def resize(self, view: PoolView) -> None:
        """Size each tier's queue for `view`: its endpoints' batch caps, with `HEADROOM`."""
        caps: dict[Tier, int] = dict.fromkeys(TIERS, 0)
        for pool in view.pools.values():
            caps[pool.spec.tier] += len(pool.endpoints) * pool.spec.batching.max_num_seqs
        for tier, cap in caps.items():
            capacity = max(1, int(cap * HEADROOM))
            queue = self.queues.get(tier)
            if queue is None:
                self.queues[tier] = TierQueue(tier, capacity, max_waiting=max(16, capacity))
            else:
                queue.resize(capacity, max_waiting=max(16, capacity))

    async def admit(
        self, view: PoolView, model: str, priority: Priority, tiers: Sequence[Tier]
    ) -> Tier:
        """A slot in the queue of the first of `tiers` that takes the request (more than one:
        `service_tier: auto`, which moves on from a saturated or full tier before it waits);
        give it back with `release`."""
        for i, candidate in enumerate(tiers):
            last = i == len(tiers) - 1
            busy = self.saturation.is_saturated(view, model, candidate)
            queue = self.queues[candidate]
            if busy and (priority == "flex" or not last):
                if last:
                    self._on_shed(candidate, priority)
                    raise shed_error(candidate, 2)
                continue
            if not last and queue.active >= queue.capacity:
                continue  # full here: an auto request tries the next tier before waiting
            try:
                await queue.acquire(priority)
            except Shed:
                self._on_shed(candidate, priority)
                if last:
                    raise shed_error(candidate, 1) from None
                continue
            return candidate
        raise shed_error(tiers[0], 1)  # unreachable: the last tier either admits or raises

    def release(self, tier: Tier) -> None:
        """Give back the slot `admit` took in `tier`'s queue."""
        self.queues[tier].release()
