"""What the request path needs of budgets and rate limits: in one process's memory
(router/tenants/budgets.py, ratelimit.py), or leased from the shared PostgreSQL ledger
(fleet_budgets.py, fleet_ratelimit.py). A check that needs the database first says so
(`needs_lease`), and the caller awaits `lease`; every other call is synchronous."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from tiergate.router.tenants.budgets import BudgetStatus
from tiergate.router.tenants.registry import Tenant

__all__ = ["Budgets", "Limits"]


class Budgets(Protocol):
    def needs_lease(self, tenant: Tenant, hold_usd: float, now_s: float) -> bool: ...

    async def lease(self, tenant: Tenant, hold_usd: float, now_s: float) -> None: ...

    def check(
        self, tenant: Tenant, now_s: float | None = None, hold_usd: float = 0.0
    ) -> float | None:
        """Take a hold of `hold_usd` for a request and return it, for `release`; None when the
        tenant has no budget and nothing is held (a budget added by a reload meanwhile must
        not see a release of a hold it never took)."""
        ...

    def room_usd(self, tenant: Tenant, now_s: float) -> float | None:
        """What the tenant's budget lets one more request spend now: the budget less what is
        spent and in flight (a fleet: what this replica's lease leaves); None when the tenant
        has no budget or it is not known without a round trip."""
        ...

    def release(self, tenant: Tenant, hold_usd: float) -> None: ...

    def shrink_hold(self, tenant: Tenant, usd: float) -> None: ...

    def add(self, tenant: Tenant, cost_usd: float, now_s: float | None = None) -> None: ...

    async def current(self, tenant: Tenant, now_s: float | None = None) -> BudgetStatus: ...

    def spent_usd(self, tenant: Tenant, now_s: float) -> float | None:
        """The tenant's spend in its current period as this process knows it, without
        waiting on a database (for /metrics); None when it does not know it."""
        ...


class Limits(Protocol):
    def needs_lease(self, tenant: Tenant, estimated_tokens: int) -> bool: ...

    async def lease(self, tenant: Tenant, estimated_tokens: int) -> None: ...

    def check(
        self, tenant: Tenant, now_s: float | None = None, estimated_tokens: int = 0
    ) -> None: ...

    def settle(self, tenant: Tenant, now_s: float | None = None, token_delta: int = 0) -> None: ...

    def prune(self, keep: Collection[str]) -> None: ...
