"""Spend budgets: refuse a tenant's requests once it has spent its budget for the period.

A tenant's budget (`budgetUsd`) applies per `budgetPeriod`: a UTC calendar `day`, an ISO `week`
(from Monday 00:00 UTC), a calendar `month`, or `total` (never resets). The guard keeps each
tenant's spend in the current period in memory and reads it from the ledger the first time the
tenant is checked, so a restarted router keeps enforcing budgets. Every period starts at 00:00
UTC, so the ledger's daily totals give its spend exactly.

Contract with the caller: record an attempt in the ledger first, then call `add` with no
`await` in between. The ledger is then always the truth the in-memory figure is rebuilt from,
and a figure rebuilt from it never counts an attempt twice (`add` only updates a tenant the
guard already tracks; one it does not yet track is read from the ledger at its next `check`).

Requests in flight count too: `check` takes a hold of the most the request may cost (what the
node can produce, at the dearest price it may be served at: `PoolView.most_cost_usd`), admits
while the spend so far plus the holds of requests in flight is under the budget, and the caller
releases the hold when the request ends (its actual cost is `add`ed). A hold is never less than
the cost, so a period's spend stays under the budget plus the hold of the last request admitted;
a request admitted still completes and is billed. A refusal only because of holds is
temporary: its Retry-After is 1 s.
Time is Unix time (`time.time` by default) because periods are calendar periods.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tiergate.router.base.errors import RouterError
from tiergate.router.ledger.sqlite import Ledger, utc_day
from tiergate.router.tenants.registry import BudgetPeriod, Tenant

__all__ = ["BudgetGuard", "BudgetStatus", "budget_refusal", "period_bounds", "period_label"]


def period_bounds(period: BudgetPeriod, now_s: float) -> tuple[float, float | None]:
    """Start and end (Unix seconds) of the UTC period containing `now_s`; `total` has no end."""
    if period == "total":
        return 0.0, None
    now = datetime.fromtimestamp(now_s, UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + timedelta(days=1)
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else (start.replace(month=start.month + 1))
        )
    return start.timestamp(), end.timestamp()


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """A tenant's spend in its current budget period."""

    period: BudgetPeriod
    period_start_s: float
    period_end_s: float | None  # None for `total`
    spent_usd: float
    budget_usd: float | None  # None: unlimited

    @property
    def remaining_usd(self) -> float | None:
        return None if self.budget_usd is None else max(0.0, self.budget_usd - self.spent_usd)


@dataclass(slots=True)
class _Spend:
    period: BudgetPeriod
    start_s: float
    end_s: float | None
    spent_usd: float

    def contains(self, now_s: float) -> bool:
        return self.start_s <= now_s and (self.end_s is None or now_s < self.end_s)


class BudgetGuard:
    """Per-tenant spend in the current period, enforced before each request."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Callable[[], float] = time.time,
        tenants: Iterable[Tenant] = (),
    ) -> None:
        """`tenants` with budgets are read from the ledger now rather than at first use."""
        self._ledger = ledger
        self._clock = clock
        self._spend: dict[str, _Spend] = {}
        self._held: dict[str, list[float]] = {}  # tenant -> [requests, USD] held in flight
        now_s = clock()
        for tenant in tenants:
            if tenant.budget_usd is not None:
                self._tracked(tenant, now_s)

    def check(
        self, tenant: Tenant, now_s: float | None = None, hold_usd: float = 0.0
    ) -> float | None:
        """Take a hold of `hold_usd` for a request, or raise RouterError(429,
        insufficient_quota) if the tenant has spent its budget, counting the holds of its
        requests in flight. Returns the hold, for `release` when the request ends; None for a
        tenant without a budget (nothing held, nothing to release).

        `Retry-After` is the time to the next period (a spent `total` budget has none), or 1 s
        when only requests in flight stand in the way.
        """
        budget = tenant.budget_usd
        if budget is None:
            return None
        now = self._clock() if now_s is None else now_s
        spend = self._tracked(tenant, now)
        held = self._held.get(tenant.name)
        in_flight_usd = held[1] if held is not None else 0.0
        if spend.spent_usd + in_flight_usd < budget:
            held = self._held.setdefault(tenant.name, [0, 0.0])
            held[0] += 1
            held[1] += hold_usd
            return hold_usd
        raise budget_refusal(
            tenant, spend.period, budget, spend.spent_usd, spend.end_s, now, in_flight_usd
        )

    def room_usd(self, tenant: Tenant, now_s: float) -> float | None:
        """The budget less the period's spend and the holds of requests in flight."""
        budget = tenant.budget_usd
        if budget is None:
            return None
        held = self._held.get(tenant.name)
        in_flight_usd = held[1] if held is not None else 0.0
        return budget - self._tracked(tenant, now_s).spent_usd - in_flight_usd

    def needs_lease(self, tenant: Tenant, hold_usd: float, now_s: float) -> bool:
        """Never: one process's budgets need no database round trip (router/tenants/
        fleet_budgets.py is the guard that does)."""
        return False

    async def lease(self, tenant: Tenant, hold_usd: float, now_s: float) -> None:
        return None

    async def current(self, tenant: Tenant, now_s: float | None = None) -> BudgetStatus:
        """`status`, as the fleet guard answers it."""
        return self.status(tenant, now_s)

    def release(self, tenant: Tenant, hold_usd: float) -> None:
        """End the hold `check` took for a request (once it was accounted for)."""
        held = self._held.get(tenant.name)
        if held is None:
            return
        held[0] -= 1
        held[1] -= hold_usd
        if held[0] <= 0:
            del self._held[tenant.name]  # exactly zero again, whatever the rounding

    def shrink_hold(self, tenant: Tenant, usd: float) -> None:
        """Part of a request's hold was spent (and counted by `add`): the hold shrinks by it.
        `release` then takes what is left of it."""
        held = self._held.get(tenant.name)
        if held is not None:
            held[1] -= usd

    def add(self, tenant: Tenant, cost_usd: float, now_s: float | None = None) -> None:
        """Count an attempt's cost, after it was recorded in the ledger (see the module doc)."""
        spend = self._spend.get(tenant.name)
        if spend is None:
            return  # read from the ledger, this attempt included, when first needed
        now = self._clock() if now_s is None else now_s
        if spend.period != tenant.budget_period or not spend.contains(now):
            # A new period (or a reload changed the period): the ledger is rebuilt from lazily.
            del self._spend[tenant.name]
            return
        spend.spent_usd += cost_usd

    def status(self, tenant: Tenant, now_s: float | None = None) -> BudgetStatus:
        """The tenant's spend in its current period (for `GET /v1/usage`)."""
        now = self._clock() if now_s is None else now_s
        spend = self._tracked(tenant, now)
        return BudgetStatus(
            spend.period, spend.start_s, spend.end_s, spend.spent_usd, tenant.budget_usd
        )

    def spent_usd(self, tenant: Tenant, now_s: float) -> float | None:
        """The tenant's spend in its current period (read from the ledger at a period's
        start, as `check` does); None for a tenant without a budget."""
        if tenant.budget_usd is None:
            return None
        return self._tracked(tenant, now_s).spent_usd

    def _tracked(self, tenant: Tenant, now_s: float) -> _Spend:
        spend = self._spend.get(tenant.name)
        if spend is None or spend.period != tenant.budget_period or not spend.contains(now_s):
            # The ledger's daily totals: one row per day and tier served, whatever the traffic.
            start_s, end_s = period_bounds(tenant.budget_period, now_s)
            spent_usd = self._ledger.spend_in_days(
                tenant.name, utc_day(start_s), None if end_s is None else utc_day(end_s)
            )
            spend = _Spend(tenant.budget_period, start_s, end_s, spent_usd)
            self._spend[tenant.name] = spend
        return spend


def budget_refusal(
    tenant: Tenant,
    period: BudgetPeriod,
    budget_usd: float,
    spent_usd: float,
    end_s: float | None,
    now_s: float,
    held_usd: float | None = None,
) -> RouterError:
    """The 429 for a tenant whose budget is spent (`Retry-After` to the period's end; none for
    `total`), or, while `spent_usd` is still under it, whose requests in flight may spend the
    rest (`Retry-After: 1`; `held_usd`: what they hold, when known)."""
    label = period_label(period)
    headers = {}
    if spent_usd < budget_usd:
        headers["Retry-After"] = "1"
        held = f", ${held_usd:.4f} held for them" if held_usd is not None else ""
        message = (
            f"tenant {tenant.name!r} has requests in flight that may spend the rest of its "
            f"{label} budget (${spent_usd:.4f} spent of ${budget_usd:.2f}{held}); "
            "retry when they end"
        )
    else:
        if end_s is None:
            when = "it does not reset; an administrator can raise budgetUsd"
        else:
            headers["Retry-After"] = str(max(1, math.ceil(end_s - now_s)))
            reset = datetime.fromtimestamp(end_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            when = f"it resets at {reset}"
        message = (
            f"tenant {tenant.name!r} has spent its {label} budget "
            f"(${spent_usd:.4f} of ${budget_usd:.2f}); {when}"
        )
    return RouterError(
        429, message, type="insufficient_quota", code="budget_exceeded", headers=headers
    )


def period_label(period: BudgetPeriod) -> str:
    return {"day": "daily", "week": "weekly", "month": "monthly", "total": "total"}[period]
