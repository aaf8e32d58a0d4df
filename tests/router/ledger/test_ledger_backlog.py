"""The ledger's backlog: records held in memory while the database refuses writes, written once
it takes them again; and a router whose ledger is locked still bills and enforces budgets."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tenant_router_helpers import KEY, tenant_router

from tiergate.router.ledger.backlog import LedgerBacklogWriter
from tiergate.router.ledger.sqlite import Ledger, LedgerError, UsageRecord, utc_day

T0 = 1_800_000_000.0


def usage(n: int, **changes: Any) -> UsageRecord:
    record = UsageRecord(
        request_id=f"req-{n}", time_s=T0 + n, tenant="alice", tier_requested="batched",
        tier_served="batched", pool="p", endpoint="e", prompt_tokens=100, completion_tokens=10,
        latency_s=1.0, ttft_s=0.1, cost_usd=0.5, http_status=200, outcome="ok",
    )  # fmt: skip
    return dataclasses.replace(record, **changes)


@contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Another process's write transaction (an operator's sqlite3 shell, say) for the block."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def rows(path: Path) -> list[tuple[str, float]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT request_id, cost_usd FROM usage ORDER BY id").fetchall()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "ledger.sqlite") as opened:
        yield opened


def test_records_wait_in_memory_while_the_database_is_locked_and_keep_their_order(
    ledger: Ledger, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger.record(usage(0))
    with write_locked(path):
        for n in range(1, 6):
            ledger.record(usage(n))
        assert ledger.backlog == 5
        # Totals and budget spend count what is held: budgets stay enforced meanwhile.
        assert ledger.tenant_totals("alice").cost_usd == pytest.approx(3.0)
        assert ledger.tenant_totals("alice").by_tier_served["batched"].requests == 6
        assert ledger.spend_in_days("alice", utc_day(T0)) == pytest.approx(3.0)
        assert ledger.spend_in_days("alice", utc_day(T0) + 1) == 0.0
        assert ledger.tenant_totals("bob").requests == 0
        # Still locked: nothing is written, and nothing is lost.
        assert ledger.flush_backlog(100) == 0
        assert ledger.backlog == 5
    assert [r for r, _ in rows(path)] == ["req-0"]
    assert ledger.flush_backlog(3) == 3 and ledger.backlog == 2
    assert ledger.flush_backlog(100) == 2 and ledger.backlog == 0
    assert [r for r, _ in rows(path)] == [f"req-{n}" for n in range(6)]
    # Written once, not counted twice.
    assert ledger.tenant_totals("alice").cost_usd == pytest.approx(3.0)
    assert ledger.dropped == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("event=ledger_write_failed" in m for m in messages) == 1  # once per outage
    assert any("event=ledger_backlog_written" in m for m in messages)


def test_a_held_record_is_not_retried_on_every_request(ledger: Ledger, tmp_path: Path) -> None:
    with write_locked(tmp_path / "ledger.sqlite"):
        ledger.record(usage(1))
        tries = 0
        write = ledger._write

        def counting(record: UsageRecord) -> None:
            nonlocal tries
            tries += 1
            write(record)

        ledger._write = counting  # type: ignore[method-assign]
        for n in range(2, 12):
            ledger.record(usage(n))
    # Each would have waited for the lock on the event loop: they joined the backlog instead.
    assert tries == 0 and ledger.backlog == 11


def test_a_full_backlog_drops_new_records_and_counts_them(ledger: Ledger, tmp_path: Path) -> None:
    ledger.max_backlog = 3
    with write_locked(tmp_path / "ledger.sqlite"):
        for n in range(5):
            ledger.record(usage(n))
    assert (ledger.backlog, ledger.dropped) == (3, 2)
    ledger.flush_backlog(100)
    assert [r for r, _ in rows(tmp_path / "ledger.sqlite")] == ["req-0", "req-1", "req-2"]


def test_a_record_the_database_can_never_take_is_dropped_not_held(
    ledger: Ledger, tmp_path: Path
) -> None:
    # NaN binds as NULL, which the schema refuses: retrying would block the backlog for ever.
    bad = usage(2, latency_s=float("nan"))
    with pytest.raises(LedgerError):
        ledger.record(bad)
    assert (ledger.backlog, ledger.dropped) == (0, 1)
    with write_locked(tmp_path / "ledger.sqlite"):
        for record in (usage(1), bad, usage(3)):
            ledger.record(record)
    assert ledger.flush_backlog(100) == 3
    assert [r for r, _ in rows(tmp_path / "ledger.sqlite")] == ["req-1", "req-3"]
    assert (ledger.backlog, ledger.dropped) == (0, 2)


def test_closing_writes_the_backlog(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    with write_locked(path):
        ledger.record(usage(1))
    ledger.close()
    assert [r for r, _ in rows(path)] == ["req-1"]


def test_closing_says_how_many_held_records_are_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    with write_locked(path):
        ledger.record(usage(1))
        ledger.record(usage(2))
        with caplog.at_level(logging.ERROR):
            ledger.close()
    assert "event=ledger_backlog_lost" in caplog.text and "records=2" in caplog.text
    assert rows(path) == []


async def test_the_writer_drains_the_backlog_in_the_background(
    ledger: Ledger, tmp_path: Path
) -> None:
    writer = LedgerBacklogWriter(ledger, interval_s=0.01, batch_rows=7)
    writer.start()
    try:
        with write_locked(tmp_path / "ledger.sqlite"):
            for n in range(50):
                ledger.record(usage(n))
            await asyncio.sleep(0.1)  # tries while locked: nothing written, nothing lost
            assert ledger.backlog == 50
        async with asyncio.timeout(10):
            while ledger.backlog:
                await asyncio.sleep(0.01)
    finally:
        await writer.stop()
    assert len(rows(tmp_path / "ledger.sqlite")) == 50


def test_a_router_whose_ledger_is_locked_still_bills_and_enforces_budgets(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    path = tmp_path / "ledger.sqlite"
    # $1 per output token: each 1-token reply costs $1 (and a little for its prompt).
    with (
        tenant_router(
            served,
            path,
            tmp_path,
            budget="budgetUsd: 2, budgetPeriod: day",
            pool="billing: {outputPerMillionUsd: 1000000}",
        ) as (app, url),
        served(app.metrics_app) as metrics_port,
    ):
        body = {
            "model": "coder",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "ignore_eos": True,
        }

        def ask() -> httpx.Response:
            return httpx.post(
                url + "/v1/chat/completions",
                content=json.dumps(body),
                headers={**KEY, "content-type": "application/json"},
                timeout=30,
            )

        with write_locked(path):
            statuses = [ask().status_code for _ in range(4)]
            usage_now = httpx.get(url + "/v1/usage", headers=KEY).json()
            metrics = httpx.get(metrics_port + "/metrics").text
        # Two served ($1 each), then the budget refused: a locked ledger did not lift it.
        assert statuses == [200, 200, 429, 429]
        assert usage_now["budget"]["spent_usd"] == pytest.approx(2.0, rel=0.01)
        assert usage_now["totals"]["requests"] == 4
        assert "tiergate_ledger_backlog_records 4.0" in metrics
        assert "tiergate_accounting_errors_total 0.0" in metrics
        deadline = time.monotonic() + 30
        while app.router.ledger.backlog:
            assert time.monotonic() < deadline, "the backlog was not written"
            time.sleep(0.05)
        assert len(rows(path)) == 4
        after = httpx.get(url + "/v1/usage", headers=KEY).json()
        assert after["totals"] == usage_now["totals"]
