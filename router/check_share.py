"""The cascade's check workers, shared fairly between tenants.

`slots` checks run at once. A check that finds every slot taken waits, and two rules keep
any number of tenants sending slow schemas from holding the slots while others wait:

- A freed slot goes to the waiting tenant with the most budget left (its `standing`, from
  router/check_budget.py), not to the one that came first, so a tenant whose checks are cheap
  goes ahead of every tenant whose checks have been slow.
- A check that has held its slot for `share_s` while another tenant waits is asked to give
  way (`Hold.give_way` resolves; the checker ends it). The one asked is the holder that has
  spent the most of its budget, and only for a waiter that has spent no more. A waiting
  check therefore waits about `share_s` at most, not for the running checks' deadline.

Callers hold one slot per tenant at a time (the checker runs a tenant's checks one after
another), so the waiters are other tenants than the holders. Runs on the event loop; no I/O.
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
    started_at: float  # the event loop's clock
    #: Resolves when the check should give way to a waiting tenant.
    give_way: asyncio.Future[None]


@dataclass(eq=False, slots=True)
class _Waiter:
    order: int
    tenant: str
    granted: asyncio.Future[None] = field(repr=False)


class FairShare:
    """`slots` slots for tenants' checks, handed out by standing, with give-way after
    `share_s` when another tenant waits."""

    def __init__(self, slots: int, *, share_s: float, standing: Callable[[str], float]) -> None:
        if slots < 1:
            raise ValueError("a share needs at least one slot")
        self.share_s = share_s
        self._standing = standing
        self._free = slots
        self._holders: list[Hold] = []
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
        if self._free:
            self._free -= 1
            return self._hold(tenant)
        waiter = _Waiter(next(self._order), tenant, loop.create_future())
        self._waiting.append(waiter)
        self._reconsider()
        granted = False
        try:
            async with asyncio.timeout(timeout_s):
                await waiter.granted
            granted = True
        except TimeoutError:
            pass
        finally:
            if not granted:
                self._withdraw(waiter)
        return self._hold(tenant) if granted else None

    def release(self, hold: Hold) -> None:
        """The check is over: its slot goes to the best-standing waiter, or back to the pool."""
        self._holders.remove(hold)
        self._hand_on()

    def _hold(self, tenant: str) -> Hold:
        loop = asyncio.get_running_loop()
        hold = Hold(tenant, loop.time(), loop.create_future())
        self._holders.append(hold)
        if self._waiting:
            self._reconsider()  # a slot taken while others wait: it may have to give way
        return hold

    def _withdraw(self, waiter: _Waiter) -> None:
        """A waiter leaves (timed out, cancelled); a slot handed to it as it left goes on."""
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            waiter.granted.cancel()
            self._reconsider()
        elif waiter.granted.done() and not waiter.granted.cancelled():
            self._hand_on()

    def _hand_on(self) -> None:
        if self._waiting:
            best = max(self._waiting, key=lambda w: (self._standing(w.tenant), -w.order))
            self._waiting.remove(best)
            best.granted.set_result(None)
        else:
            self._free += 1
        self._reconsider()

    def _reconsider(self) -> None:
        """Ask as many holders to give way as there are waiters no slot is coming for yet;
        if too few have had their share, look again when the next one will have."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        coming = sum(1 for h in self._holders if h.give_way.done())
        needed = len(self._waiting) - coming
        if needed <= 0:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        best_waiter = max(self._standing(w.tenant) for w in self._waiting)
        running = [h for h in self._holders if not h.give_way.done()]
        ripe = sorted(
            (
                h
                for h in running
                if now + _EARLY_S >= h.started_at + self.share_s
                and self._standing(h.tenant) <= best_waiter
            ),
            key=lambda h: (self._standing(h.tenant), h.started_at),
        )
        for hold in ripe[:needed]:
            hold.give_way.set_result(None)
        unripe = [h.started_at for h in running if now + _EARLY_S < h.started_at + self.share_s]
        if len(ripe) < needed and unripe:
            self._timer = loop.call_at(min(unripe) + self.share_s, self._reconsider)
