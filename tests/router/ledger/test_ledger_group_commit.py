"""Group commit: records added within one round of the event loop share one transaction, and
`committed()` returns only once they are on disk (as far as SIGKILL is concerned)."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tenant_router_helpers import KEY, tenant_router
from test_ledger_backlog import rows, usage, write_locked

from tiergate.router.ledger.sqlite import Ledger, LedgerError, UsageRecord

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


class CountingCommits:
    """The ledger's connection, counting COMMITs (and failing them on demand)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db, self.commits, self.fail = db, 0, False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            self.commits += 1
            if self.fail:
                raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_records_added_in_one_round_share_one_commit(path: Path) -> None:
    with Ledger(path) as ledger:
        counting = CountingCommits(ledger._db)
        ledger._db = counting  # type: ignore[assignment]

        async def request(n: int) -> list[str]:
            ledger.add(usage(n))
            await ledger.committed()
            return [r for r, _ in rows(path)]  # what another process sees now

        seen = await asyncio.gather(*(request(n) for n in range(5)))
        assert counting.commits == 1
        every = [f"req-{n}" for n in range(5)]
        assert seen == [every] * 5  # each waited for the commit that holds its record
        # A later round is a new batch.
        ledger.add(usage(5))
        assert [r for r, _ in rows(path)] == every  # not committed yet
        await ledger.committed()
        assert counting.commits == 2 and [r for r, _ in rows(path)] == [*every, "req-5"]
        # Reads on the ledger's own connection see an open batch: totals and budgets count it.
        ledger.add(usage(6))
        assert ledger.tenant_totals("alice").requests == 7
        await ledger.committed()


async def test_nothing_to_wait_for_returns_at_once(path: Path) -> None:
    with Ledger(path) as ledger:
        await ledger.committed()  # no batch: does not even yield
        ledger.add(usage(1))
        ledger.commit_batch()  # committed before the loop got to it: the waiter returns too
        await asyncio.wait_for(ledger.committed(), 5)
        assert [r for r, _ in rows(path)] == ["req-1"]


async def test_a_failed_commit_holds_the_whole_batch_in_order(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Ledger(path) as ledger:
        counting = CountingCommits(ledger._db)
        ledger._db = counting  # type: ignore[assignment]
        counting.fail = True
        for n in range(3):
            ledger.add(usage(n))
        await ledger.committed()
        assert ledger.backlog == 3 and rows(path) == []
        assert ledger.tenant_totals("alice").requests == 3  # budgets still see them
        assert not ledger._db.in_transaction
        ledger.add(usage(3))  # joins the backlog behind them: order is kept
        assert ledger.backlog == 4
        counting.fail = False
        assert ledger.flush_backlog(100) == 4
        assert [r for r, _ in rows(path)] == [f"req-{n}" for n in range(4)]
        assert ledger.tenant_totals("alice").requests == 4  # written once, counted once
    assert any("records=3" in r.getMessage() for r in caplog.records)


async def test_a_locked_database_holds_the_batch_and_later_records(path: Path) -> None:
    with Ledger(path) as ledger:
        ledger.add(usage(0))
        await ledger.committed()
        with write_locked(path):
            ledger.add(usage(1))  # waits out the busy timeout once, then holds
            ledger.add(usage(2))  # held without waiting again
            await ledger.committed()
            assert ledger.backlog == 2
        assert ledger.flush_backlog(100) == 2
        assert [r for r, _ in rows(path)] == ["req-0", "req-1", "req-2"]


@pytest.mark.parametrize(
    "bad",
    [
        usage(2, latency_s=float("nan")),  # binds as NULL, which the schema refuses
        usage(2, prompt_tokens=10**19),  # no SQLite integer holds it (OverflowError, not sqlite3's)
        usage(2, time_s=1e30),  # its row binds; its day for the totals does not
    ],
)
async def test_a_record_the_database_can_never_take_leaves_the_batch_standing(
    path: Path, bad: UsageRecord
) -> None:
    with Ledger(path) as ledger:
        ledger.add(usage(1))
        with pytest.raises(LedgerError):
            ledger.add(bad)
        ledger.add(usage(3))
        await asyncio.wait_for(ledger.committed(), 5)
        with pytest.raises(LedgerError):
            ledger.add(bad)  # alone in its batch
        await asyncio.wait_for(ledger.committed(), 5)
        assert not ledger._db.in_transaction
        ledger.add(usage(4))  # the next batch opens as usual
        await asyncio.wait_for(ledger.committed(), 5)
        assert [r for r, _ in rows(path)] == ["req-1", "req-3", "req-4"]
        # Neither its row nor its totals went in: each record's two statements go together.
        assert ledger.tenant_totals("alice").requests == 3
        assert (ledger.dropped, ledger.backlog) == (2, 0)


async def test_writes_outside_the_batch_commit_it_first(path: Path) -> None:
    with Ledger(path) as ledger:
        ledger.add(usage(1))
        ledger.record(usage(2))  # in order: the batch is committed before it
        assert [r for r, _ in rows(path)] == ["req-1", "req-2"]
        ledger.add(usage(3))
        assert ledger.prune(10, before_s=0) == 0  # pruning commits the batch first
        assert [r for r, _ in rows(path)] == ["req-1", "req-2", "req-3"]
        ledger.add(usage(4))
    assert [r for r, _ in rows(path)] == [f"req-{n}" for n in range(1, 5)]  # close commits


def test_outside_an_event_loop_add_commits_at_once(path: Path) -> None:
    with Ledger(path) as ledger:
        ledger.add(dataclasses.replace(usage(1)))
        assert [r for r, _ in rows(path)] == ["req-1"]


def defer_the_first_commit(ledger: Ledger) -> list[bool]:
    """Make the loop's first scheduled commit land 0.3 s late; the list is true once it did."""
    real = ledger.commit_batch
    held: list[bool] = []

    def late_commit() -> None:
        if ledger._batch and not held:
            held.append(True)
            asyncio.get_running_loop().call_later(0.3, real)
            return
        real()

    ledger.commit_batch = late_commit  # type: ignore[method-assign]
    return held


CHAT_BODY: dict[str, Any] = {
    "model": "coder",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 2,
}


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_goes_out_only_once_its_record_is_committed(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]], stream: bool
) -> None:
    """The commit is held back for a while: the reply (a whole one, or a stream's [DONE]) waits
    for it, so a client holding the reply always finds it in the ledger file."""
    path = tmp_path / "ledger.sqlite"
    with tenant_router(served, path, tmp_path, budget="budgetUsd: 100, budgetPeriod: day") as (
        app,
        url,
    ):
        held = defer_the_first_commit(app.router.ledger)
        body = {**CHAT_BODY, "stream": stream}
        with httpx.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=KEY, timeout=30
        ) as reply:
            assert reply.status_code == 200
            text = reply.read().decode()
        assert held, "the commit was not deferred"
        assert ("data: [DONE]" in text) == stream
        assert len(rows(path)) == 1  # on disk by the time the client had its reply


def test_an_internal_error_goes_out_only_once_its_record_is_committed(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    path = tmp_path / "ledger.sqlite"
    with tenant_router(served, path, tmp_path, budget="budgetUsd: 100, budgetPeriod: day") as (
        app,
        url,
    ):
        held = defer_the_first_commit(app.router.ledger)

        async def broken(*_: object, **__: object) -> None:
            raise RuntimeError("a bug")

        app.router.upstream.open = broken  # type: ignore[method-assign]
        reply = httpx.post(url + "/v1/chat/completions", json=CHAT_BODY, headers=KEY, timeout=30)
        assert reply.status_code == 500 and reply.json()["error"]["type"] == "server_error"
        assert held and len(rows(path)) == 1
