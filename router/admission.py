"""Admission: a queue per tier in front of its endpoints, and the saturation flags.

Each tier admits at most `capacity` requests at once: the batch caps of its endpoints (a slot
per pool of which is held for a tenant below its fair share), so that requests beyond them
wait here, where the tier's queue (router/tier_queue.py) orders
them by priority and, within a priority, by tenants' weighted fair share. A request the
router has sent on waits at its node first come, first served, so the router keeps none
waiting there. When the wait queue is full, a request is shed (429 with Retry-After).

A tier whose models are served by disjoint sets of pools has a queue for each set (named
`<tier>:<pool>+<pool>...`), sized by those pools' caps: one model's flood cannot fill the
slots of another model's pools, and that model's requests do not wait behind it. Sets that
share a pool keep the tier's one queue (a queue each would count the shared slots twice).

A tier is also *saturated* when every endpoint reports (vLLM metrics) at least
`SATURATION_WAITING` queued requests: that catches load the router does not see (other
clients of the nodes). Flex requests are shed at once from a saturated tier. Those figures
change only when the scraper writes them, so `Saturation` works the flags out after each
scrape round and for each new view, and a request reads one flag instead of every endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import TIERS, Priority, Tier
from tiergate.router.discovery.view import PoolView
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.tenants.registry import Tenant
from tiergate.router.tier_queue import AdmissionOrder, Grant, Shed, TenantQueueFull, TierQueue

__all__ = ["Admission", "AdmissionEvents", "Grant", "Saturation", "saturated", "shed_error"]

#: Per-endpoint waiting requests beyond which a tier counts as saturated.
SATURATION_WAITING = 8.0
#: The smallest wait queue a tier has, however small its capacity.
MIN_WAITING = 16


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


def tenant_queue_error(tier: str, tenant: str, waiting: int) -> RouterError:
    return RouterError(
        429,
        f"tenant {tenant!r} already has {waiting} request(s) waiting for the {tier} tier "
        "(its maxQueued); retry once some are served",
        type="rate_limit_error",
        code="tenant_queue_full",
        headers={"Retry-After": "1"},
    )


def _nothing(*_: object) -> None:
    return None


@dataclass(frozen=True, slots=True)
class AdmissionEvents:
    """What admission tells the metrics: a request shed (tier, priority); one admitted after
    waiting (tier, tenant, seconds); one that ended (tier, tenant, tokens served)."""

    shed: Callable[[Tier, Priority], None] = _nothing
    waited: Callable[[Tier, str, float], None] = _nothing
    served: Callable[[Tier, str, int], None] = _nothing


class Admission:
    """Every tier's queue, sized from the view's batch caps, and the saturation flags."""

    def __init__(
        self,
        saturation: Saturation,
        events: AdmissionEvents | None = None,
        order: AdmissionOrder = "fair",
        headroom_per_pool: int = 0,
    ) -> None:
        self.saturation = saturation
        self.order: AdmissionOrder = order
        self.headroom_per_pool = headroom_per_pool
        #: The queues by name: a tier's, or one of its sets of pools (the module docstring).
        self.queues: dict[str, TierQueue] = {}
        #: (model, tier) -> the name of its queue, where the tier's models queue apart.
        self._names: dict[tuple[str, Tier], str] = {}
        self._events = events or AdmissionEvents()
        #: Requests inside a tier's queue now, by (tier, model asked for): the queue itself
        #: does not know the model, which is what tells which pools will serve them.
        self._waiting: dict[tuple[Tier, str], int] = {}

    def resize(self, view: PoolView) -> None:
        """Size the queues for `view`: each tier's, by its endpoints' batch caps, and where a
        tier's models are served by disjoint sets of pools, one for each set, by its pools'
        (a model with no endpoint waits in the tier's). A queue the view no longer asks for
        goes once nothing holds or waits in it; while the pools change, the tier may admit
        more than its caps for as long as that one's requests run."""
        sets: dict[tuple[str, Tier], frozenset[str]] = {
            (members.model, members.tier): frozenset(e.pool for e in members)
            for members in view.candidate_sets()
            if members
        }
        apart = {tier for tier in TIERS if _disjoint(
            {pools for (_, t), pools in sets.items() if t == tier}
        )}  # fmt: skip
        wanted: dict[str, tuple[Tier, int, int]] = {t: self._size(view, t, None) for t in TIERS}
        names: dict[tuple[str, Tier], str] = {}
        for (model, tier), pools in sets.items():
            if tier in apart:
                names[(model, tier)] = name = f"{tier}:{'+'.join(sorted(pools))}"
                wanted[name] = self._size(view, tier, pools)
        for name, (tier, capacity, headroom) in wanted.items():
            queue = self.queues.get(name)
            if queue is None:
                self.queues[name] = TierQueue(
                    tier, capacity, max(MIN_WAITING, capacity), order=self.order,
                    headroom=headroom, name=name,
                )  # fmt: skip
            else:
                queue.resize(capacity, max(MIN_WAITING, capacity), headroom)
        for name in [n for n, q in self.queues.items() if n not in wanted]:
            if not self.queues[name].active and not self.queues[name].waiting:
                del self.queues[name]
        self._names = names

    def _size(
        self, view: PoolView, tier: Tier, pools: frozenset[str] | None
    ) -> tuple[Tier, int, int]:
        """(tier, capacity, headroom) of the queue of `pools` of `tier` (None: all of them)."""
        capacity = headroom = 0
        for pool in view.pools.values():
            if pool.spec.tier == tier and (pools is None or pool.spec.name in pools):
                capacity += len(pool.endpoints) * pool.slots
                headroom += bool(pool.endpoints) * self.headroom_per_pool
        return tier, max(1, capacity), headroom

    def prune(self, keep: Collection[str]) -> None:
        """Forget what the queues keep of tenants not in `keep` (a reload removed them)."""
        for queue in self.queues.values():
            queue.prune(keep)

    def queue_for(self, model: str, tier: Tier) -> TierQueue:
        """The queue a request for `model` waits in to be served by `tier`."""
        return self.queues[self._names.get((model, tier), tier)]

    def has_room(self, tier: Tier, model: str) -> bool:
        """Whether `tier` would admit a request for `model` now, without it waiting."""
        return self.queue_for(model, tier).has_room()

    async def admit(
        self,
        view: PoolView,
        model: str,
        priority: Priority,
        tiers: Sequence[Tier],
        tenant: Tenant,
        tokens: int,
    ) -> Grant:
        """A slot in the queue of the first of `tiers` that takes the request (more than one:
        a request that may move, which moves on from a saturated or full tier before it
        waits in the last); give it back with `release`. `tokens` is what the request is
        expected to cost, prompt and output (its fair-share charge)."""
        for i, candidate in enumerate(tiers):
            last = i == len(tiers) - 1
            busy = self.saturation.is_saturated(view, model, candidate)
            queue = self.queue_for(model, candidate)
            if busy and (priority == "flex" or not last):
                if last:
                    self._events.shed(candidate, priority)
                    raise shed_error(candidate, 2)
                continue
            if not last and not queue.has_room():
                continue  # full here: try the next tier before waiting
            key = (candidate, model)
            self._waiting[key] = self._waiting.get(key, 0) + 1
            try:
                grant = await queue.acquire(
                    priority,
                    tenant.name,
                    weight=tenant.weight,
                    tokens=tokens,
                    max_queued=tenant.max_queued,
                )
            except TenantQueueFull as full:
                self._events.shed(candidate, priority)
                raise tenant_queue_error(candidate, tenant.name, full.waiting) from None
            except Shed:
                self._events.shed(candidate, priority)
                if last:
                    raise shed_error(candidate, 1) from None
                continue
            finally:
                self._unwait(key)
            self._events.waited(candidate, tenant.name, grant.waited_s)
            return grant
        raise shed_error(tiers[0], 1)  # unreachable: the last tier either admits or raises

    def waiting(self) -> dict[tuple[Tier, str], int]:
        """Requests waiting in the tiers' queues now, by (tier, model asked for)."""
        return dict(self._waiting)

    def _unwait(self, key: tuple[Tier, str]) -> None:
        left = self._waiting[key] - 1
        if left:
            self._waiting[key] = left
        else:
            del self._waiting[key]

    def release(self, grant: Grant, served_tokens: int | None = None) -> None:
        """Give back the slot `admit` granted; `served_tokens` is what the request used
        (prompt + output), when known."""
        self.queues[grant.queue].release(grant, served_tokens)
        if served_tokens:
            self._events.served(grant.tier, grant.tenant, served_tokens)


def _disjoint(sets: set[frozenset[str]]) -> bool:
    """Whether there are several `sets` and no two share a pool: then each is a queue of its
    own. Sets that overlap would count the slots they share twice: their tier keeps one."""
    return len(sets) > 1 and sum(map(len, sets)) == len(frozenset().union(*sets))
