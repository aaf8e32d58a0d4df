"""One tier's admission queue: at most `capacity` requests at once, the rest wait in order.

Priorities come first: premium before standard before flex. Within a priority the order is
the queue's `order`:

- `fair` (the default): weighted least attained service, counted in tokens as the Virtual
  Token Counter scheduler counts them (Sheng et al., "Fairness in Serving Large Language
  Models", OSDI 2024). Each tenant has a counter of the tokens (prompt + output) the tier
  served it, divided by its weight. A freed slot goes to the waiting tenant with the lowest
  counter (on a tie, the one with fewer requests waiting), and to its earliest request. A
  request is charged what it is expected to cost when admitted (its prompt and `max_tokens`)
  and corrected to what it used when it ends. A tenant that starts waiting is lifted to the
  lowest counter among the tenants already waiting (or, in an empty queue, to the counter of
  the tenant served last), so idle time banks no credit: a tenant cannot save up service and
  then take the tier over.
- `fcfs`: first come, first served.

Either way the queue is work-conserving but for its `headroom`: that many of its slots
(the router holds back one per pool) are kept for a tenant below its fair share, the
weighted share of the slots that tenants holding or waiting for them would each have. A
tenant flooding the tier fills the rest; a light tenant arriving then starts at once, within
a step, instead of waiting for one of the flood's requests to end.

Across a fleet of router processes (router/fleet_share.py), each process's queue fills only the
slots the fleet allotted it (`share_fleet`): per tenant, plus spare ones. It serves its own
tenants still under their allotment first, and lends headroom only to a tenant whose slots
across the fleet stay within its share. Slots held over a part that moved away take none of
the headroom while the fleet holds them back where the part went.

The wait queue is bounded (`max_waiting`). When it is full, an arrival pushes out a waiter of
a lower priority; within one priority, `fair` pushes out the latest request of the tenant
holding the most waiting requests per unit of weight (the arrival itself when that is its own
tenant), so a tenant flooding the tier fills only the room others leave, and `fcfs` sheds
the arrival. A tenant may also have a cap of its own (`max_queued`) on its waiting requests.

Runs on one event loop; no I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from tiergate.router.base.tiers import Priority, Tier

__all__ = [
    "AdmissionOrder",
    "FleetSlots",
    "Grant",
    "PRIORITY_RANK",
    "Shed",
    "TenantQueueFull",
    "TierQueue",
]

AdmissionOrder = Literal["fair", "fcfs"]
#: Priorities in the order they are served (tiergate/common/tiers.py `Priority`).
PRIORITY_RANK: dict[Priority, int] = {p: rank for rank, p in enumerate(get_args(Priority))}


class Shed(Exception):
    """This request was shed: the tier's queue was full (now or while it waited)."""


class TenantQueueFull(Shed):
    """The tenant already has its most requests waiting for this tier (`max_queued`)."""

    def __init__(self, waiting: int) -> None:
        super().__init__(waiting)
        self.waiting = waiting


@dataclass(eq=False, slots=True)
class Grant:
    """A slot held in a tier's queue, until `TierQueue.release`."""

    tier: Tier
    tenant: str
    charged_tokens: int  # what the tenant's counter was charged when admitted
    weight: float
    waited_s: float = 0.0
    queue: str = ""  # the queue's name (router/admission.py)


@dataclass(frozen=True, slots=True)
class FleetSlots:
    """What one process's queue may fill, from the fleet's last exchange: slots per tenant of
    its own and `spare` ones for anyone; `shared` is what the fleet shares out (the tier's
    slots less headroom); the others' tenants, their weights and the slots they hold."""

    tenants: Mapping[str, int]
    spare: int
    shared: int
    weights_elsewhere: Mapping[str, float]
    holding_elsewhere: Mapping[str, int]
    #: Per tenant, slots it held here beyond its part when the fleet holds them back where the
    #: part went (router/fleet_allotment.py `HolderSlots.held_over`).
    held_over: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.tenants.values()) + self.spare


@dataclass(eq=False, slots=True)
class _Waiter:
    seq: int
    tenant: str
    tokens: int
    weight: float
    enqueued_s: float
    future: asyncio.Future[Grant] = field(repr=False)


class TierQueue:
    """Admission for one tier."""

    def __init__(
        self,
        tier: Tier,
        capacity: int,
        max_waiting: int,
        *,
        order: AdmissionOrder = "fair",
        clock: Callable[[], float] = time.monotonic,
        headroom: int = 0,
        name: str | None = None,
    ) -> None:
        self.tier = tier
        #: The queue's name among the router's (the tier's, unless its models queue apart).
        self.name = name or tier
        self.capacity = max(capacity, 1)
        self.headroom = _headroom(self.capacity, headroom, order)
        self.max_waiting = max_waiting
        self.order: AdmissionOrder = order
        self.active = 0
        self.shed_count = 0
        self._clock = clock
        self._seq = 0
        #: Per priority rank: tenant -> its waiting requests, earliest first.
        self._ranks: list[dict[str, deque[_Waiter]]] = [{} for _ in PRIORITY_RANK]
        self._waiting = 0
        #: Attained service per tenant: tokens served / weight (the fair order's counters).
        self._service: dict[str, float] = {}
        #: The tenant admitted last: its counter now (corrected as its requests end) is the
        #: floor of a tenant arriving at an empty queue.
        self._last_tenant = ""
        #: Slots held per tenant, and the weight each last asked with (for fair shares).
        self._holding: dict[str, int] = {}
        self._weights: dict[str, float] = {}
        #: Tokens actually served per tenant (what its requests used, as they end).
        self.served: dict[str, int] = {}
        #: This process's part of the fleet's slots; None: the tier's, on its own.
        self._fleet: FleetSlots | None = None
        #: Slots tenants still hold here beyond their part of the fleet's allotment (a part
        #: that moved away) which the fleet holds back where the part went until they end
        #: (`FleetSlots.held_over`): they take none of this process's headroom.
        self._held_over: dict[str, int] = {}
        #: Called when one of those ends: the fleet learns sooner that its slot is free
        #: (router/fleet_share.py exchanges at once).
        self.on_held_over_ended: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        return self._waiting

    def waiting_of(self, tenant: str) -> int:
        """Requests of `tenant` waiting in this queue, at any priority."""
        return sum(len(rank.get(tenant, ())) for rank in self._ranks)

    def holding_of(self, tenant: str) -> int:
        """Slots `tenant` holds in this queue."""
        return self._holding.get(tenant, 0)

    def weight_of(self, tenant: str) -> float:
        """The weight `tenant` last asked with (1 if it never did)."""
        return self._weights.get(tenant, 1.0)

    def tenants(self) -> dict[str, float]:
        """The tenants holding or waiting for slots, and their weights."""
        present = {*self._holding, *(t for rank in self._ranks for t in rank)}
        return {t: self._weights.get(t, 1.0) for t in present}

    @property
    def fleet(self) -> FleetSlots | None:
        return self._fleet

    def share_fleet(self, slots: FleetSlots | None) -> None:
        """Fill only `slots` from now on (None: every slot of the tier, on its own). Nothing
        admitted is shed by fewer: it takes effect as requests end."""
        self._fleet = slots
        self._held_over = {}
        if slots is not None:
            for tenant, claimed in slots.held_over.items():
                now = self._holding.get(tenant, 0) - slots.tenants.get(tenant, 0)
                if (over := min(claimed, now)) > 0:  # some may have ended since the claims
                    self._held_over[tenant] = over
        self._hand_on()

    def has_room(self) -> bool:
        """Whether a request would be admitted now without waiting (headroom aside)."""
        return self.active < self._open() and not self._waiting

    def prune(self, keep: Collection[str]) -> None:
        """Forget the counters of tenants not in `keep` (a reload removed them) that hold and
        wait for nothing here."""
        present = self.tenants()
        for table in (self._service, self._weights, self.served):
            for tenant in [t for t in table if t not in keep and t not in present]:
                del table[tenant]

    def known(self) -> set[str]:
        """The tenants this queue keeps anything of."""
        return {*self._service, *self._weights, *self.served, *self.tenants()}

    def service(self, tenant: str) -> float:
        """`tenant`'s counter: tokens the tier served it, over its weight (and any lift)."""
        return self._service.get(tenant, 0.0)

    async def acquire(
        self,
        priority: Priority,
        tenant: str = "",
        *,
        weight: float = 1.0,
        tokens: int = 0,
        max_queued: int | None = None,
    ) -> Grant:
        """Wait for a slot; raises Shed if this request is shed (now or while waiting).

        `tokens` is what the request is expected to cost (prompt + output): the tenant's
        counter is charged that much over `weight` when the slot is granted."""
        self._weights[tenant] = weight
        if (not self._waiting and self.active < self._open()) or (
            self.active < self._open() + self.headroom and self._below_share(tenant)
        ):
            self._lift(tenant)
            self.active += 1
            return self._grant(tenant, tokens, weight, 0.0)
        if max_queued is not None and (mine := self.waiting_of(tenant)) >= max_queued:
            self.shed_count += 1
            raise TenantQueueFull(mine)
        rank = PRIORITY_RANK[priority]
        if self._waiting >= self.max_waiting:
            self._push_out(rank, tenant, weight)  # or raise Shed: this arrival is the one to go
        if not self.waiting_of(tenant):
            self._lift(tenant)
        self._seq += 1
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(self._seq, tenant, tokens, weight, self._clock(), future)
        self._ranks[rank].setdefault(tenant, deque()).append(waiter)
        self._waiting += 1
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                if future.exception() is None:  # given a slot as we went away: served nothing
                    self.release(future.result(), served_tokens=0)
            else:
                self._discard(rank, waiter)
            raise

    def release(self, grant: Grant, served_tokens: int | None = None) -> None:
        """Give the slot back; `served_tokens` (prompt + output actually served, when known)
        corrects the tenant's counter from what it was charged on admission."""
        self.active -= 1
        held = self._holding.get(grant.tenant, 0) - 1
        if held > 0:
            self._holding[grant.tenant] = held
        else:
            self._holding.pop(grant.tenant, None)
        if was := self._held_over.get(grant.tenant):
            part = self._fleet.tenants.get(grant.tenant, 0) if self._fleet is not None else 0
            if (over := min(was, held - part)) > 0:
                self._held_over[grant.tenant] = over
            else:
                del self._held_over[grant.tenant]
            if over < was and self.on_held_over_ended is not None:
                self.on_held_over_ended()
        if served_tokens:
            self.served[grant.tenant] = self.served.get(grant.tenant, 0) + served_tokens
        if served_tokens is not None and grant.weight > 0:
            correction = (served_tokens - grant.charged_tokens) / grant.weight
            self._service[grant.tenant] = self._service.get(grant.tenant, 0.0) + correction
        self._hand_on()

    def resize(self, capacity: int, max_waiting: int, headroom: int | None = None) -> None:
        """New limits (the tier's endpoints changed); waiters get the slots a larger
        capacity frees at once, not when a running request ends. Nothing admitted or waiting
        is shed by a smaller one: it takes effect as requests end."""
        self.capacity = max(capacity, 1)
        self.max_waiting = max_waiting
        if headroom is not None:
            self.headroom = _headroom(self.capacity, headroom, self.order)
        self._hand_on()

    # -- internals -------------------------------------------------------------------------

    def _open(self) -> int:
        """The slots whoever waits may fill (the rest of the capacity is headroom): across a
        fleet, this process's part, and the slots held over it that the fleet holds back
        where the part went."""
        if self._fleet is not None:
            return self._fleet.total + sum(self._held_over.values())
        return self.capacity - self.headroom

    def _below_share(self, tenant: str) -> bool:
        """Whether `tenant` holds fewer slots than its weighted share of those the flood may
        fill (capacity less the headroom), shared among the tenants holding or waiting for
        slots, itself included: such a tenant may take a headroom slot. Across a fleet, its
        slots and the tenants present are the fleet's, and it may take one only if it then
        stays within its share (or holds none): every process has headroom of its own."""
        if not self.headroom:
            return False
        present = {*self._holding, *(t for rank in self._ranks for t in rank), tenant}
        fleet = self._fleet
        weights = dict(fleet.weights_elsewhere) if fleet is not None else {}
        weights.update((t, self._weights.get(t, 1.0)) for t in present)
        total = sum(max(w, 0.0) for w in weights.values())
        mine = max(weights[tenant], 0.0)
        shared = fleet.shared if fleet is not None else self.capacity - self.headroom
        share = shared * mine / total if total > 0 else 0.0
        held = self._holding.get(tenant, 0)
        if fleet is None:
            return held < share
        held += fleet.holding_elsewhere.get(tenant, 0)
        return held == 0 or held + 1 <= share + 1e-9

    def _under_allotment(self, tenant: str) -> bool:
        """Across a fleet: whether `tenant` holds fewer slots here than allotted to it here."""
        fleet = self._fleet
        return fleet is not None and self._holding.get(tenant, 0) < fleet.tenants.get(tenant, 0)

    def _grant(self, tenant: str, tokens: int, weight: float, waited_s: float) -> Grant:
        self._holding[tenant] = self._holding.get(tenant, 0) + 1
        served = self._service.get(tenant, 0.0) + (tokens / weight if weight > 0 else 0.0)
        self._service[tenant] = served
        self._last_tenant = tenant
        return Grant(self.tier, tenant, tokens, weight, waited_s, self.name)

    def _lift(self, tenant: str) -> None:
        """A tenant that was not waiting starts no lower than those that were (VTC)."""
        if self.order != "fair":
            return
        floors = [self._service.get(t, 0.0) for rank in self._ranks for t in rank]
        floor = min(floors) if floors else self._service.get(self._last_tenant, 0.0)
        if self._service.get(tenant, 0.0) < floor:
            self._service[tenant] = floor

    def _next_tenant(self, rank: dict[str, deque[_Waiter]], among: list[str] | None = None) -> str:
        """The tenant whose request is served next within one priority (of `among`, if
        given)."""
        tenants = rank if among is None else among
        if self.order == "fcfs":
            return min(tenants, key=lambda t: rank[t][0].seq)
        service, under = self._service, self._under_allotment
        return min(
            tenants,
            key=lambda t: (not under(t), service.get(t, 0.0), len(rank[t]), rank[t][0].seq),
        )

    def _below_in(self, rank: dict[str, deque[_Waiter]]) -> list[str]:
        return [t for t in rank if self._below_share(t)]

    def _hand_on(self) -> None:
        while self._waiting and self.active < self._open() + self.headroom:
            rank = next(r for r in self._ranks if r)
            tenant = self._next_tenant(rank)
            if self.active >= self._open() and not self._below_share(tenant):
                # Only headroom is left: for the next waiter, in order, below its share.
                found = next(
                    ((r, below) for r in self._ranks if (below := self._below_in(r))), None
                )
                if found is None:
                    return
                rank, below = found
                tenant = self._next_tenant(rank, below)
            waiter = self._pop(rank, tenant, latest=False)
            if waiter.future.done():
                continue  # cancelled; its task will find it gone
            self.active += 1
            waited = self._clock() - waiter.enqueued_s
            waiter.future.set_result(self._grant(tenant, waiter.tokens, waiter.weight, waited))

    def _push_out(self, rank: int, tenant: str, weight: float) -> None:
        """Make room in a full queue for an arrival of `rank` from `tenant` (of `weight`), or
        raise Shed when the arrival itself is the request to go. A waiting tenant's weight is
        its latest request's."""
        worst = max(r for r, tenants in enumerate(self._ranks) if tenants)
        if rank > worst:
            self._shed_arrival()
        tenants = self._ranks[worst]
        if self.order == "fcfs":
            if rank == worst:
                self._shed_arrival()
            victim = max(tenants, key=lambda t: tenants[t][-1].seq)
        else:

            def excess(t: str) -> float:
                mine = len(tenants.get(t, ())) + (1 if t == tenant and rank == worst else 0)
                of = weight if t == tenant else tenants[t][-1].weight
                return mine / max(of, 1e-9)

            candidates = [*tenants, tenant] if rank == worst else list(tenants)
            # On a tie the arrival goes, not a request that waited already.
            victim = max(candidates, key=lambda t: (excess(t), t == tenant and rank == worst))
            if victim == tenant and rank == worst:
                self._shed_arrival()
        waiter = self._pop(tenants, victim, latest=True)
        self.shed_count += 1
        if not waiter.future.done():
            waiter.future.set_exception(Shed())

    def _shed_arrival(self) -> None:
        self.shed_count += 1
        raise Shed

    def _pop(self, rank: dict[str, deque[_Waiter]], tenant: str, *, latest: bool) -> _Waiter:
        waiters = rank[tenant]
        waiter = waiters.pop() if latest else waiters.popleft()
        if not waiters:
            del rank[tenant]
        self._waiting -= 1
        return waiter

    def _discard(self, rank: int, waiter: _Waiter) -> None:
        waiters = self._ranks[rank].get(waiter.tenant)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._ranks[rank][waiter.tenant]
            self._waiting -= 1


def _headroom(capacity: int, asked: int, order: AdmissionOrder) -> int:
    """The slots held back for tenants below their share: none in `fcfs` order, and never
    more than a quarter of the capacity (a small tier keeps its slots for whoever waits)."""
    if order != "fair":
        return 0
    return max(0, min(asked, capacity // 4))
