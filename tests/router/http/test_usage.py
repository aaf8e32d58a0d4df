"""`GET /v1/usage` body: the caller's own tenant only, JSON-ready."""

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tiergate.router.base.tiers import Tier
from tiergate.router.http.usage import usage_response
from tiergate.router.ledger.sqlite import Ledger, UsageRecord
from tiergate.router.tenants.budgets import BudgetGuard
from tiergate.router.tenants.registry import Tenant

NOW = datetime(2026, 12, 30, 18, tzinfo=UTC).timestamp()
TEAM_A = Tenant("team-a", budget_usd=10.0, budget_period="month")
TEAM_B = Tenant("team-b")


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with Ledger(":memory:") as opened:
        yield opened


def record(ledger: Ledger, tenant: str, served: Tier, cost_usd: float, attempt: int = 1) -> None:
    ledger.record(
        UsageRecord(
            request_id=f"{tenant}-{served}", time_s=NOW, tenant=tenant, tier_requested=served,
            tier_served=served, pool=served, endpoint="e", prompt_tokens=100,
            completion_tokens=10, latency_s=1.0, ttft_s=0.1, cost_usd=cost_usd, http_status=200,
            outcome="ok", attempt=attempt,
        )
    )  # fmt: skip


def test_usage_of_the_calling_tenant_only(ledger: Ledger) -> None:
    budgets = BudgetGuard(ledger, clock=lambda: NOW)
    record(ledger, "team-a", "wafer-scale", 0.1)
    record(ledger, "team-a", "premium", 0.6, attempt=2)
    record(ledger, "team-b", "batched", 99.0)
    body = asyncio.run(usage_response(ledger, TEAM_A, budgets, NOW))
    assert json.loads(json.dumps(body)) == body  # JSON-ready
    assert body["tenant"] == "team-a"
    assert body["budget"] == {
        "period": "month",
        "period_start": "2026-12-01T00:00:00Z",
        "period_end": "2027-01-01T00:00:00Z",
        "budget_usd": 10.0,
        "spent_usd": 0.7,
        "remaining_usd": 9.3,
    }
    assert body["totals"] == {
        "requests": 1,
        "attempts": 2,
        "prompt_tokens": 200,
        "completion_tokens": 20,
        "total_tokens": 220,
        "cost_usd": 0.7,
    }
    assert body["by_tier_served"]["batched"] == {
        "requests": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
    }
    assert body["by_tier_served"]["premium"]["cost_usd"] == 0.6
    assert "99" not in json.dumps(body)


def test_unlimited_tenant(ledger: Ledger) -> None:
    record(ledger, "team-b", "batched", 1.5)
    body = asyncio.run(usage_response(ledger, TEAM_B, BudgetGuard(ledger, clock=lambda: NOW)))
    assert body["budget"]["budget_usd"] is None and body["budget"]["remaining_usd"] is None
    assert body["budget"]["spent_usd"] == 1.5
