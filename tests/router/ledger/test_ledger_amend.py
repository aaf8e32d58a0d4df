"""Amending a row: a stream's attempt is written at its first token and amended as it goes, so
its row and its daily totals always say what was relayed, whatever happens to the batches
they are written in."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest
from test_ledger_backlog import T0, usage, write_locked
from test_ledger_group_commit import CountingCommits

from tiergate.router.ledger.sqlite import Ledger, LedgerError, utc_day


def row_values(path: Path) -> list[tuple[str, int, float, str]]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT request_id, completion_tokens, cost_usd, outcome FROM usage ORDER BY id"
        ).fetchall()


def daily(path: Path) -> list[tuple[int, int, int, int, float]]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT day, requests, attempts, completion_tokens, cost_usd FROM tenant_daily"
            " ORDER BY day"
        ).fetchall()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


def test_an_amended_row_says_the_new_values_and_its_totals_move_by_the_difference(
    path: Path,
) -> None:
    with Ledger(path) as ledger:
        entry = ledger.record(usage(1, completion_tokens=1, cost_usd=0.1, outcome="incomplete"))
        ledger.amend(entry, usage(1, completion_tokens=40, cost_usd=0.3, outcome="incomplete"))
        ledger.amend(entry, usage(1, completion_tokens=90, cost_usd=0.7, outcome="ok"))
        ledger.record(usage(2))
        totals = ledger.tenant_totals("alice")
    assert row_values(path) == [("req-1", 90, 0.7, "ok"), ("req-2", 10, 0.5, "ok")]
    assert (totals.requests, totals.attempts, totals.completion_tokens) == (2, 2, 100)
    assert totals.cost_usd == pytest.approx(1.2)


def test_a_row_amended_on_a_later_utc_day_bills_that_day_what_it_grew_by(path: Path) -> None:
    """A stream that runs past midnight: what it relayed after is that day's spend (a daily
    budget's period), and it is still one request."""
    day_end = (utc_day(T0) + 1) * 86400.0
    with Ledger(path) as ledger:
        entry = ledger.record(usage(1, time_s=day_end - 1, cost_usd=0.25, completion_tokens=5))
        ledger.amend(entry, usage(1, time_s=day_end + 1, cost_usd=0.75, completion_tokens=15))
        assert ledger.spend_in_days("alice", utc_day(day_end)) == pytest.approx(0.5)
    first = utc_day(day_end) - 1
    assert daily(path) == [(first, 1, 1, 5, 0.25), (first + 1, 0, 0, 10, 0.5)]


async def test_a_batch_that_fails_leaves_its_entries_as_the_database_holds_them(
    path: Path,
) -> None:
    """An entry added and amended in a batch whose commit fails is held once, and written
    once, as it says last; an amendment of a committed row that fails is written later as an
    amendment, not a second row."""
    with Ledger(path) as ledger:
        kept = ledger.add(usage(1, cost_usd=0.1, completion_tokens=1, outcome="incomplete"))
        await ledger.committed()
        counting = CountingCommits(ledger._db)
        ledger._db = counting  # type: ignore[assignment]
        counting.fail = True
        new = ledger.add(usage(2, cost_usd=0.1, completion_tokens=1, outcome="incomplete"))
        ledger.amend(new, usage(2, cost_usd=0.2, completion_tokens=2, outcome="incomplete"))
        ledger.amend(kept, usage(1, cost_usd=0.3, completion_tokens=3, outcome="incomplete"))
        await ledger.committed()
        assert ledger.backlog == 2 and row_values(path) == [("req-1", 1, 0.1, "incomplete")]
        # Held: an amendment changes what the backlog will write; budgets see it meanwhile.
        ledger.amend(new, usage(2, cost_usd=0.4, completion_tokens=4))
        assert ledger.backlog == 2
        assert ledger.spend_in_days("alice", 0) == pytest.approx(0.3 + 0.4)
        assert ledger.tenant_totals("alice").requests == 2
        counting.fail = False
        assert ledger.flush_backlog(100) == 2
        ledger.amend(kept, usage(1, cost_usd=0.5, completion_tokens=5))  # written again at once
        await ledger.committed()
        assert ledger.tenant_totals("alice").requests == 2
    assert row_values(path) == [("req-1", 5, 0.5, "ok"), ("req-2", 4, 0.4, "ok")]
    ((_, requests, attempts, tokens, cost),) = daily(path)
    assert (requests, attempts, tokens) == (2, 2, 9) and cost == pytest.approx(0.9)


async def test_an_amendment_while_another_process_holds_the_lock_waits_in_the_backlog(
    path: Path,
) -> None:
    with Ledger(path) as ledger:
        entry = ledger.add(usage(1, cost_usd=0.1, outcome="incomplete"))
        await ledger.committed()
        with write_locked(path):
            ledger.amend(entry, usage(1, cost_usd=0.6))
            await ledger.committed()
            assert ledger.backlog == 1
            assert ledger.spend_in_days("alice", 0) == pytest.approx(0.6)
        assert ledger.flush_backlog(100) == 1
    assert row_values(path) == [("req-1", 10, 0.6, "ok")]


async def test_an_amendment_the_database_can_never_take_leaves_the_row_as_it_was(
    path: Path,
) -> None:
    with Ledger(path) as ledger:
        entry = ledger.add(usage(1, cost_usd=0.1, outcome="incomplete"))
        with pytest.raises(LedgerError):
            ledger.amend(entry, dataclasses.replace(entry.record, prompt_tokens=10**19))
        await ledger.committed()
        assert ledger.dropped == 1
    assert row_values(path) == [("req-1", 10, 0.1, "incomplete")]
    assert daily(path)[0][4] == pytest.approx(0.1)
