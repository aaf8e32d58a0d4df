"""The cascade's check workers, shared fairly between tenants.

`slots` checks run at once, a tenant's one at a time (its others wait, in order). A check
that finds no slot it may take waits, and two rules keep any number of tenants sending slow
schemas from holding the slots while others wait:

- A freed slot goes to the waiting tenant with the most budget left (its `standing`, from
  router/request/check_budget.py), not to the one that came first, so a tenant whose checks
  are cheap goes ahead of every tenant whose checks have been slow. That includes the tenant
  whose check just ended: a cheap tenant with checks queued keeps the slot for the next one.
- A check that has held its slot for `share_s` while another tenant waits is asked to give
  way (`Hold.give_way` resolves; the checker ends it), once its tenant has spent no less than
  the waiter, counting the time of the check running now. The one asked is the holder whose
  tenant has the least left. A tenant that has spent less than those holding the slots
  therefore waits about `share_s` for one, not for the running checks' deadline; a fresh
  tenant's first slow check gives way too, as it spends while it runs.

Runs on the event loop; no I/O.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["FairShare", "Hold"]

#: The event loop may run a timer this early (its clock's resolution, rounded up).
_EARLY_S = 0.001


@dataclass(eq=False, slots=True)
class Hold:
    """A slot held by one tenant's check."""

    tenant: str
    started_at: float  # the event loop's clock: when granted, then when the check began
    #: Resolves when the check should give way to a waiting tenant.
    give_way: asyncio.Future[None]
    began: bool = False  # only a check that runs may be asked to give way


@dataclass(eq=False, slots=True)
class _Waiter:
    order: int
    tenant: str
    granted: asyncio.Future[Hold] = field(repr=False)


class FairShare:
    """`slots` slots for tenants' checks, one per tenant at a time, handed out by standing,
    with give-way after `share_s` when another tenant waits."""

    def __init__(self, slots: int, *, share_s: float, standing: Callable[[str], float]) -> None:
        if slots < 1:
            raise ValueError("a share needs at least one slot")
        self.share_s = share_s
        self._standing = standing
        self._free = slots
        self._holders: dict[str, Hold] = {}  # by tenant
        self._waiting: list[_Waiter] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        """Checks waiting for a slot."""
        return len(self._waiting)

    async def acquire(self, tenant: str, timeout_s: float) -> Hold | None:
        """A slot for one of `tenant`'s checks; None when none came within `timeout_s`."""
        loop = asyncio.get_running_loop()
        if self._free and tenant not in self._holders:
            self._free -= 1
            return self._hold(tenant)
        waiter = _Waiter(next(self._order), tenant, loop.create_future())
        self._waiting.append(waiter)
        self._reconsider()
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(waiter.granted)
        except TimeoutError:
            if waiter.granted.done():  # handed a slot as its time ran out: take it
                return waiter.granted.result()
            self._leave(waiter)
            return None
        except BaseException:
            if waiter.granted.done():  # handed a slot as it was cancelled: hand it on
                self.release(waiter.granted.result())
            else:
                self._leave(waiter)
            raise

    def release(self, hold: Hold) -> None:
        """The check is over: its slot goes to the best-standing waiter, or back to the pool."""
        if self._holders.get(hold.tenant) is not hold:
            return  # released already
        del self._holders[hold.tenant]
        eligible = [w for w in self._waiting if w.tenant not in self._holders]
        if eligible:
            best = max(eligible, key=lambda w: (self._standing(w.tenant), -w.order))
            self._waiting.remove(best)
            best.granted.set_result(self._hold(best.tenant))
        else:
            self._free += 1
        self._reconsider()

    def begin(self, hold: Hold) -> None:
        """The check starts now (its worker is ready): its share is counted from here, so
        starting a worker is not counted against the tenant."""
        hold.started_at, hold.began = asyncio.get_running_loop().time(), True
        if self._waiting:
            self._reconsider()

    def _leave(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        waiter.granted.cancel()
        self._reconsider()

    def _hold(self, tenant: str) -> Hold:
        loop = asyncio.get_running_loop()
        hold = Hold(tenant, loop.time(), loop.create_future())
        self._holders[tenant] = hold
        return hold

    def _reconsider(self) -> None:
        """Ask as many holders to give way as there are tenants waiting that no slot is
        coming for yet; if too few may be asked now, look again when the next one may."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        coming = sum(1 for h in self._holders.values() if h.give_way.done())
        tenants = {w.tenant for w in self._waiting if w.tenant not in self._holders}
        needed = len(tenants) - coming
        if needed <= 0:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        best_waiter = max(self._standing(t) for t in tenants)

        def left_s(hold: Hold) -> float:  # what its tenant has left, counting this check
            return self._standing(hold.tenant) - (now - hold.started_at)

        def askable_at(hold: Hold) -> float:  # its share had, and spent no less than a waiter
            return max(hold.started_at + self.share_s, now + left_s(hold) - best_waiter)

        running = [h for h in self._holders.values() if h.began and not h.give_way.done()]
        ripe = sorted(
            (h for h in running if askable_at(h) <= now + _EARLY_S),
            key=lambda h: (left_s(h), h.started_at),
        )
        for hold in ripe[:needed]:
            hold.give_way.set_result(None)
        later = [askable_at(h) for h in running if askable_at(h) > now + _EARLY_S]
        if len(ripe) < needed and later:
            self._timer = loop.call_at(min(later), self._reconsider)
