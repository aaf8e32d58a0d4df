"""Spend budgets held across every router replica and worker, through the PostgreSQL ledger.

Each replica leases from the database what it may have in flight of a tenant's budget, and
admits requests against its lease with no round trip; it asks for more only when its lease is
spent. A lease is granted under a per-tenant lock from what the budget leaves after the
period's committed spend and the other replicas' live leases (router/ledger/postgres_schema.py
`tiergate_lease_budget`): the replica's own requests in flight (their holds, and records not
yet committed) plus a slice of the room left, at least the new request's hold. Admission is
the single-process rule, per lease: a request is admitted while its replica's requests in
flight are under the lease. So over the fleet, a period's spend stays under the budget plus
one request's hold per replica.

Every `renew_s` a replica renews its leases: an active one takes a fresh slice, an idle one
keeps only what it has in flight, so an idle replica does not sit on another's room. A lease
expires `ttl_s` after its last renewal: a replica that died gives its room back then.

While the database cannot be reached, a replica keeps admitting within the lease it has until
the lease expires; a request that needs more is refused with 503 and `Retry-After: 1`, so a
budget is never exceeded because the database was down. Tenants without a budget are
unaffected.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiergate.router.base.background import LoopService
from tiergate.router.base.errors import RouterError
from tiergate.router.ledger.postgres import PostgresLedger
from tiergate.router.ledger.records import MAX_DAY, LedgerError, utc_day
from tiergate.router.tenants.budgets import BudgetStatus, budget_refusal, period_bounds
from tiergate.router.tenants.registry import Tenant

__all__ = ["FleetBudgets", "holder_id"]

log = logging.getLogger("tiergate.router")

#: A lease not renewed for this long is void (its replica is gone).
LEASE_TTL_S = 10.0
#: How often a replica renews its leases.
RENEW_S = 1.0
#: A lease is used locally only until this long before the database voids it.
SAFETY_S = 2.0


def holder_id() -> str:
    """This process's name on its leases: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


@dataclass(slots=True)
class _Lease:
    period_start_s: float
    period_end_s: float | None
    granted_usd: float = 0.0
    base_usd: float = 0.0  # the ledger's `committed_usd` when it was granted
    spent_usd: float = 0.0  # the fleet's committed spend in the period, at the last lease
    valid_until: float = -math.inf  # monotonic; before it the lease may be used
    held_usd: float = 0.0  # holds of this replica's requests in flight
    held_requests: int = 0
    active: bool = False  # admitted a request since the last renewal
    unreachable: bool = False  # the last round trip failed


class FleetBudgets(LoopService):
    """Budgets through leases in the PostgreSQL ledger (a service: `start`, `stop`)."""

    task_name = "budget-leases"

    def __init__(
        self,
        ledger: PostgresLedger,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        holder: str | None = None,
        ttl_s: float = LEASE_TTL_S,
        renew_s: float = RENEW_S,
    ) -> None:
        self._ledger = ledger
        self._clock, self._monotonic = clock, monotonic
        self.holder = holder or holder_id()
        self._ttl_s, self._renew_s = ttl_s, renew_s
        self._leases: dict[str, _Lease] = {}
        self._tenants: dict[str, Tenant] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.round_trips = 0
        self.failures = 0

    # The request path.

    def needs_lease(self, tenant: Tenant, hold_usd: float, now_s: float) -> bool:
        """Whether admitting a request needs a round trip first (`lease`)."""
        if tenant.budget_usd is None:
            return False
        lease = self._current(tenant, now_s)
        return (
            lease is None
            or lease.valid_until <= self._monotonic()
            or not self._admits(tenant.name, lease)
        )

    async def lease(self, tenant: Tenant, hold_usd: float, now_s: float) -> None:
        """Ask the database for room for one more request (one round trip per replica and
        tenant at a time); a database that cannot be reached leaves the lease as it was."""
        lock = self._locks.setdefault(tenant.name, asyncio.Lock())
        async with lock:
            if self.needs_lease(tenant, hold_usd, now_s):  # a waiter's call may have done it
                await self._lease(tenant, max(hold_usd, 1e-9), now_s)

    def check(
        self, tenant: Tenant, now_s: float | None = None, hold_usd: float = 0.0
    ) -> float | None:
        """Take a hold of `hold_usd` against this replica's lease, or refuse: 429 when the
        budget is spent or the rest of it is in flight, 503 when the database could not be
        asked. Returns the hold, for `release`; None for a tenant without a budget."""
        budget = tenant.budget_usd
        if budget is None:
            return None
        now = self._clock() if now_s is None else now_s
        lease = self._current(tenant, now)
        live = lease is not None and lease.valid_until > self._monotonic()
        if lease is not None and live and self._admits(tenant.name, lease):
            lease.held_usd += hold_usd
            lease.held_requests += 1
            lease.active = True
            return hold_usd
        if lease is None or not live or lease.unreachable:
            raise RouterError(
                503,
                f"the router cannot reach its budget store to check tenant {tenant.name!r}'s "
                "budget; retry shortly",
                type="server_error",
                code="budget_store_unavailable",
                headers={"Retry-After": "1"},
            )
        spent = lease.spent_usd + self._ledger.unwritten_usd(tenant.name)
        raise budget_refusal(tenant, tenant.budget_period, budget, spent, lease.period_end_s, now)

    def room_usd(self, tenant: Tenant, now_s: float) -> float | None:
        """What this replica's lease leaves for one more request; None without a live lease
        (`check` refuses then)."""
        if tenant.budget_usd is None:
            return None
        lease = self._current(tenant, now_s)
        if lease is None or lease.valid_until <= self._monotonic():
            return None
        return self._room(tenant.name, lease) - self._in_flight(tenant.name, lease)

    def release(self, tenant: Tenant, hold_usd: float) -> None:
        lease = self._leases.get(tenant.name)
        if lease is None:
            return
        lease.held_requests -= 1
        lease.held_usd -= hold_usd
        if lease.held_requests <= 0:
            lease.held_requests, lease.held_usd = 0, 0.0

    def shrink_hold(self, tenant: Tenant, usd: float) -> None:
        lease = self._leases.get(tenant.name)
        if lease is not None:
            lease.held_usd -= usd

    def add(self, tenant: Tenant, cost_usd: float, now_s: float | None = None) -> None:
        """Nothing to do: the ledger counts a record as in flight until it is committed, and
        then it is the fleet's spend."""

    async def current(self, tenant: Tenant, now_s: float | None = None) -> BudgetStatus:
        """The tenant's spend in its current period, read from the database (the same from
        every replica, once their records are committed)."""
        now = self._clock() if now_s is None else now_s
        start_s, end_s = period_bounds(tenant.budget_period, now)
        spent = await self._ledger.spend_in_days(
            tenant.name, utc_day(start_s), None if end_s is None else utc_day(end_s)
        )
        return BudgetStatus(tenant.budget_period, start_s, end_s, spent, tenant.budget_usd)

    def spent_usd(self, tenant: Tenant, now_s: float) -> float | None:
        """The fleet's spend as of this replica's last lease, plus what this replica has
        committed since; None while it holds no lease for the current period (it has not
        served the tenant)."""
        lease = self._leases.get(tenant.name)
        if lease is None or not (
            lease.period_start_s <= now_s
            and (lease.period_end_s is None or now_s < lease.period_end_s)
        ):
            return None
        return lease.spent_usd + self._ledger.committed_usd(tenant.name) - lease.base_usd

    # Leases.

    def _current(self, tenant: Tenant, now_s: float) -> _Lease | None:
        self._tenants[tenant.name] = tenant
        lease = self._leases.get(tenant.name)
        if lease is None or not (
            lease.period_start_s <= now_s
            and (lease.period_end_s is None or now_s < lease.period_end_s)
        ):
            return None
        return lease

    def _in_flight(self, name: str, lease: _Lease) -> float:
        return max(0.0, lease.held_usd) + self._ledger.unwritten_usd(name)

    def _admits(self, name: str, lease: _Lease) -> bool:
        return self._in_flight(name, lease) < self._room(name, lease)

    def _room(self, name: str, lease: _Lease) -> float:
        """What the lease still lets this replica have in flight: what it was granted, less
        what this replica committed since (the database counts that as spend now)."""
        return lease.granted_usd - (self._ledger.committed_usd(name) - lease.base_usd)

    async def _lease(self, tenant: Tenant, hold_usd: float, now_s: float) -> bool:
        """One round trip: `hold_usd` > 0 asks room for a request, 0 renews with a fresh
        slice, < 0 gives back all but what is in flight. False if the database failed."""
        budget = tenant.budget_usd
        assert budget is not None
        start_s, end_s = period_bounds(tenant.budget_period, now_s)
        lease = self._leases.get(tenant.name)
        if lease is None or lease.period_start_s != start_s:
            old = lease
            lease = _Lease(start_s, end_s)
            if old is not None:  # requests admitted in the last period still end here
                lease.held_usd, lease.held_requests = old.held_usd, old.held_requests
            self._leases[tenant.name] = lease
        asked_at = self._monotonic()
        base_usd = self._ledger.committed_usd(tenant.name)  # before the database reads spend
        try:
            pool = await self._ledger.connection_pool()
            row = await pool.fetchrow(
                "SELECT * FROM tiergate_lease_budget($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                tenant.name, self.holder, utc_day(start_s),
                MAX_DAY if end_s is None else utc_day(end_s), start_s, budget,
                self._in_flight(tenant.name, lease), hold_usd, self._ttl_s,
            )  # fmt: skip
        except (LedgerError, OSError, TimeoutError) as exc:
            lease.unreachable = True
            return self._failed(tenant, exc)
        except Exception as exc:  # asyncpg's errors
            if type(exc).__module__.startswith("asyncpg"):
                lease.unreachable = True
                return self._failed(tenant, exc)
            raise
        self.round_trips += 1
        lease.unreachable = False
        lease.granted_usd, lease.base_usd = float(row["granted"]), base_usd
        lease.spent_usd = float(row["spent"])
        lease.valid_until = asked_at + float(row["expires_in_s"]) - SAFETY_S
        return True

    def _failed(self, tenant: Tenant, exc: BaseException) -> bool:
        self.failures += 1
        if self.failures == 1 or self.failures % 100 == 0:
            reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            log.warning(
                "event=budget_lease_failed tenant=%s error=%s failures=%d",
                tenant.name, reason, self.failures,
            )  # fmt: skip
        return False

    # Renewing.

    async def stop(self) -> None:
        """Stop renewing and give every lease back."""
        await super().stop()
        if not self._leases:
            return
        try:
            pool = await self._ledger.connection_pool()
            await pool.execute("DELETE FROM budget_lease WHERE holder = $1", self.holder)
        except Exception as exc:  # the leases expire by themselves
            log.warning("event=budget_leases_not_returned error=%s", type(exc).__name__)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._renew_s)
            await self.renew()

    async def renew(self) -> None:
        """Renew every lease: a fresh slice for an active one, only what is in flight for an
        idle one; an idle lease with nothing in flight is forgotten."""
        now_s = self._clock()
        for name, lease in list(self._leases.items()):
            tenant = self._tenants.get(name)
            if tenant is None or tenant.budget_usd is None:
                del self._leases[name]
                continue
            # Under the tenant's lock: a request's lease and a renewal answered out of order
            # would leave the replica using a grant the database no longer holds for it.
            async with self._locks.setdefault(name, asyncio.Lock()):
                active, lease.active = lease.active, False
                if active:
                    await self._lease(tenant, 0.0, now_s)
                elif lease.granted_usd > 0 or self._in_flight(name, lease) > 0:
                    await self._lease(tenant, -1.0, now_s)
