"""`GET /v1/usage`: a tenant's own spend and totals, as JSON.

The handler passes the *authenticated* tenant; there is deliberately no way to name another
tenant, so a key only ever reveals its own tenant's usage.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tiergate.router.base.tiers import TIERS
from tiergate.router.ledger.store import LedgerStore
from tiergate.router.tenants.guards import Budgets
from tiergate.router.tenants.registry import Tenant

__all__ = ["usage_response"]


async def usage_response(
    ledger: LedgerStore, tenant: Tenant, budgets: Budgets, now_s: float | None = None
) -> dict[str, Any]:
    """The JSON body of `GET /v1/usage` for the calling tenant.

    Period spend comes from the budget guard (one process: in memory, the same figure it
    enforces; a fleet: the shared ledger); totals come from the ledger's running totals.
    Neither scans the tenant's history.
    """
    status = await budgets.current(tenant, now_s)
    totals = await ledger.totals(tenant.name)
    by_tier: dict[str, dict[str, Any]] = {}
    for tier in TIERS:
        served = totals.by_tier_served.get(tier)
        by_tier[tier] = {
            "requests": served.requests if served else 0,
            "prompt_tokens": served.prompt_tokens if served else 0,
            "completion_tokens": served.completion_tokens if served else 0,
            "cost_usd": _usd(served.cost_usd) if served else 0.0,
        }
    remaining = status.remaining_usd
    return {
        "object": "usage",
        "tenant": tenant.name,
        "budget": {
            "period": status.period,
            "period_start": _iso(status.period_start_s) if status.period != "total" else None,
            "period_end": _iso(status.period_end_s) if status.period_end_s is not None else None,
            "budget_usd": status.budget_usd,
            "spent_usd": _usd(status.spent_usd),
            "remaining_usd": _usd(remaining) if remaining is not None else None,
        },
        "totals": {
            "requests": totals.requests,
            "attempts": totals.attempts,
            "prompt_tokens": totals.prompt_tokens,
            "completion_tokens": totals.completion_tokens,
            "total_tokens": totals.prompt_tokens + totals.completion_tokens,
            "cost_usd": _usd(totals.cost_usd),
        },
        "by_tier_served": by_tier,
    }


def _usd(amount: float) -> float:
    # Sums of float prices drift in the last digits; a micro-dollar is far below any bill.
    return round(amount, 6)


def _iso(timestamp_s: float) -> str:
    return datetime.fromtimestamp(timestamp_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
