"""Ledger retention: request rows pruned by age and by size, bills and budgets unchanged, and a
real router that prunes its ledger while it serves."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tenant_router_helpers import KEY, tenant_router

from tiergate.router.config import ConfigError, parse_config
from tiergate.router.ledger.retention import LedgerRetention
from tiergate.router.ledger.sqlite import Ledger, LedgerError, UsageRecord
from tiergate.router.tenants.budgets import BudgetGuard
from tiergate.router.tenants.registry import Tenant

DAY = 86400.0
KUBE = "discovery: {kubernetes: {}}"  # a config that needs no pools
NOW = 1_800_000_000.0


def usage(n: int, time_s: float, tenant: str = "team-a", cost_usd: float = 0.5) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{n}", time_s=time_s, tenant=tenant, tier_requested="batched",
        tier_served="batched", pool="p", endpoint="http://127.0.0.1:9000", prompt_tokens=100,
        completion_tokens=20, latency_s=1.0, ttft_s=0.1, cost_usd=cost_usd, http_status=200,
        outcome="ok",
    )  # fmt: skip


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "ledger.sqlite") as opened:
        yield opened


def rows(ledger: Ledger) -> int:
    (count,) = ledger._db.execute("SELECT COUNT(*) FROM usage").fetchone()
    return int(count)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_rows_past_the_age_limit_go_and_bills_and_budgets_stay(ledger: Ledger) -> None:
    for n in range(300):  # one an hour, the oldest 300 hours ago
        ledger.record(usage(n, NOW - (300 - n) * 3600))
    tenant = Tenant("team-a", budget_usd=1000.0, budget_period="total")
    totals = ledger.tenant_totals("team-a")
    spent = BudgetGuard(ledger, clock=lambda: NOW).status(tenant).spent_usd
    retention = LedgerRetention(ledger, max_age_days=3, clock=lambda: NOW, batch_rows=50)
    deleted = run(retention.prune_round())
    assert deleted == 300 - 72 == retention.pruned_rows
    (oldest,) = ledger._db.execute("SELECT MIN(time_s) FROM usage").fetchone()
    assert oldest >= NOW - 3 * DAY
    assert ledger.tenant_totals("team-a") == totals
    assert BudgetGuard(ledger, clock=lambda: NOW).status(tenant).spent_usd == spent == 150.0
    assert run(retention.prune_round()) == 0  # nothing is old any more


def test_over_the_size_limit_the_oldest_rows_go(ledger: Ledger) -> None:
    for n in range(4000):
        ledger.record(usage(n, NOW + n))
    full = ledger.used_bytes()
    retention = LedgerRetention(ledger, max_bytes=full // 2, batch_rows=100)
    deleted = run(retention.prune_round())
    assert ledger.used_bytes() <= full // 2
    assert 1500 < deleted < 2500
    # The newest are kept: what is left is the last rows recorded, in one run.
    (first, last, count) = ledger._db.execute(
        "SELECT MIN(time_s), MAX(time_s), COUNT(*) FROM usage"
    ).fetchone()
    assert (first, last, count) == (NOW + deleted, NOW + 3999, 4000 - deleted)
    assert ledger.tenant_totals("team-a").requests == 4000


def test_a_round_deletes_a_bounded_number_and_the_backlog_drains_over_rounds(
    ledger: Ledger,
) -> None:
    for n in range(1000):
        ledger.record(usage(n, NOW - 10 * DAY + n))
    retention = LedgerRetention(
        ledger, max_age_days=1, clock=lambda: NOW, batch_rows=64, max_rows_per_round=300
    )
    assert [run(retention.prune_round()) for _ in range(5)] == [320, 320, 320, 40, 0]
    assert rows(ledger) == 0


def test_when_no_request_row_is_left_over_the_size_limit_it_says_so_once(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.record(usage(1, NOW))
    retention = LedgerRetention(ledger, max_bytes=1024)  # below any database's size
    with caplog.at_level(logging.WARNING, logger="tiergate.router"):
        assert run(retention.prune_round()) == 1
        assert run(retention.prune_round()) == 0
    warnings = [r.getMessage() for r in caplog.records if "ledger_over_max_size" in r.message]
    assert len(warnings) == 1 and "request_rows=0" in warnings[0]


def test_without_limits_nothing_runs(ledger: Ledger) -> None:
    retention = LedgerRetention(ledger)

    async def started() -> None:
        retention.start()
        assert retention._task is None
        await retention.stop()

    assert not retention.enabled
    run(started())


def test_a_failing_round_is_counted_and_the_next_one_still_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class FlakyLedger(Ledger):
        fail = True

        def prune(self, limit: int, *, before_s: float | None = None) -> int:
            if FlakyLedger.fail:
                FlakyLedger.fail = False
                raise LedgerError("cannot prune the usage ledger: disk I/O error")
            return super().prune(limit, before_s=before_s)

    async def scenario(ledger: Ledger) -> LedgerRetention:
        retention = LedgerRetention(
            ledger, max_age_days=1, clock=lambda: NOW, interval_s=0.01, batch_rows=10
        )
        retention.start()
        for _ in range(500):
            if rows(ledger) == 0:
                break
            await asyncio.sleep(0.01)
        await retention.stop()
        return retention

    with Ledger(tmp_path / "flaky.sqlite") as plain:
        for n in range(25):
            plain.record(usage(n, NOW - 5 * DAY))
    with FlakyLedger(tmp_path / "flaky.sqlite") as flaky, caplog.at_level(logging.WARNING):
        retention = run(scenario(flaky))
        assert (retention.failures, retention.pruned_rows, rows(flaky)) == (1, 25, 0)
    assert any("ledger_prune_failed" in r.message for r in caplog.records)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("ledgerRetentionDays: 0", "greater than 0"),
        ("ledgerRetentionDays: soon", "number"),
        ("ledgerMaxSize: lots", "could not parse"),
        ("ledgerMaxSize: 10", "greater than or equal to 1048576"),
        ("ledgerMaxSize: 768Qi", "byte unit"),
    ],
)
def test_bad_retention_settings_name_the_field(setting: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_config(f"router: {{{setting}}}\n{KUBE}")
    assert setting.split(":")[0] in str(caught.value)


@pytest.mark.parametrize(
    ("value", "size"), [("768Mi", 768 << 20), ("1Gi", 1 << 30), ("2GB", 2 * 10**9)]
)
def test_sizes_read_like_kubernetes_quantities_or_byte_units(value: str, size: int) -> None:
    assert (
        parse_config(f"router: {{ledgerMaxSize: {value}}}\n{KUBE}").router.ledger_max_size == size
    )


def test_a_running_router_prunes_its_ledger_and_bills_stay_whole(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    """A router over a ledger with 40-day-old requests, set to keep 30 days: the old rows go in
    the background while it serves, and the tenant's totals still count them."""
    path = tmp_path / "ledger.sqlite"
    wall = time.time()
    with Ledger(path) as old:
        for n in range(2000):
            old.record(usage(n, wall - 40 * DAY + n, tenant="alice", cost_usd=0.25))
    with (
        tenant_router(
            served,
            path,
            tmp_path,
            budget="budgetUsd: 1000, budgetPeriod: total",
            router="ledgerRetentionDays: 30",
        ) as (app, url),
        served(app.metrics_app) as metrics_port,
    ):
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(
            url + "/v1/chat/completions",
            content=json.dumps({**body, "max_tokens": 3}),
            headers={**KEY, "content-type": "application/json"},
            timeout=30,
        )
        assert reply.status_code == 200
        deadline = time.monotonic() + 30
        while rows(app.router.ledger) > 1:
            assert time.monotonic() < deadline, "the old rows were not pruned"
            time.sleep(0.05)
        usage_now = httpx.get(url + "/v1/usage", headers=KEY).json()
        metrics = httpx.get(metrics_port + "/metrics").text
    # The pruned requests still count: in the totals and in the budget's spend.
    assert usage_now["totals"]["requests"] == 2001
    assert usage_now["budget"]["spent_usd"] == usage_now["totals"]["cost_usd"] > 500.0
    pruned = next(x for x in metrics.splitlines() if x.startswith("tiergate_ledger_pruned_rows_"))
    assert float(pruned.split()[-1]) == 2000
    used = next(x for x in metrics.splitlines() if x.startswith("tiergate_ledger_used_bytes "))
    assert float(used.split()[-1]) > 0
