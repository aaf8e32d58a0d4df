"""The PostgreSQL ledger on a real server: records, amendments and daily totals as the SQLite
ledger keeps them, shared by several ledgers (replicas), held while the server is down and
written once it is back, and the one-line refusals at start."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from loopback_ports import free_port
from postgres_server import PostgresServer
from private_ledger import private_ledger

from tiergate.router.ledger.postgres import PostgresLedger, open_check, where
from tiergate.router.ledger.postgres_connect import AMBIGUOUS
from tiergate.router.ledger.postgres_schema import SCHEMA_VERSION
from tiergate.router.ledger.records import LedgerError, UsageRecord, utc_day

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

NOW = time.time()


def usage(request_id: str, *, tenant: str = "acme", cost: float = 0.01, completion: int = 10,
          attempt: int = 1, outcome: str = "ok", tier: str = "batched") -> UsageRecord:  # fmt: skip
    return UsageRecord(
        request_id=request_id, time_s=NOW, tenant=tenant, tier_requested="batched",
        tier_served=tier, pool="p", endpoint="e", prompt_tokens=5,  # type: ignore[arg-type]
        completion_tokens=completion, latency_s=0.1, ttft_s=0.01, cost_usd=cost,
        http_status=200, outcome=outcome, attempt=attempt,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture
async def ledger(pg_dsn: str) -> AsyncIterator[PostgresLedger]:
    await open_check(pg_dsn)
    one = PostgresLedger(pg_dsn)
    one.start()
    yield one
    await one.stop()


async def rows(dsn: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def test_a_committed_record_is_a_row_and_counts_in_the_daily_totals(
    ledger: PostgresLedger, pg_dsn: str
) -> None:
    ledger.add(usage("r1", cost=0.5))
    ledger.add(usage("r1", cost=0.25, attempt=2, tier="premium"))
    ledger.add(usage("r2", tenant="other", cost=1.0))
    await ledger.committed()
    got = await rows(pg_dsn, "SELECT request_id, attempt, cost_usd FROM usage ORDER BY id")
    assert [tuple(r) for r in got] == [("r1", 1, 0.5), ("r1", 2, 0.25), ("r2", 1, 1.0)]
    totals = await ledger.totals("acme")
    assert (totals.requests, totals.attempts, totals.cost_usd) == (1, 2, 0.75)
    assert set(totals.by_tier_served) == {"batched", "premium"}
    assert await ledger.spend_in_days("acme", utc_day(NOW), None) == 0.75
    assert await ledger.spend_in_days("acme", utc_day(NOW) + 1, None) == 0.0
    assert ledger.unwritten_usd("acme") == 0.0


async def test_an_amended_row_moves_the_totals_by_the_difference(
    ledger: PostgresLedger, pg_dsn: str
) -> None:
    entry = ledger.add(usage("s", cost=0.1, completion=1, outcome="incomplete"))
    await ledger.committed()
    ledger.amend(entry, usage("s", cost=0.3, completion=30, outcome="incomplete"))
    ledger.amend(entry, usage("s", cost=0.4, completion=40))
    assert ledger.unwritten_usd("acme") == pytest.approx(0.3)
    await ledger.committed()
    got = await rows(pg_dsn, "SELECT completion_tokens, cost_usd, outcome FROM usage")
    assert [tuple(r) for r in got] == [(40, 0.4, "ok")]
    totals = await ledger.totals("acme")
    assert (totals.requests, totals.completion_tokens) == (1, 40)
    assert totals.cost_usd == pytest.approx(0.4)


async def test_two_ledgers_on_one_database_are_one_ledger(pg_dsn: str) -> None:
    await open_check(pg_dsn)
    a, b = PostgresLedger(pg_dsn), PostgresLedger(pg_dsn)
    a.start()
    b.start()
    try:
        for i in range(50):
            (a if i % 2 else b).add(usage(f"r{i}", cost=0.01))
        await a.committed()
        await b.committed()
        totals_a, totals_b = await a.totals("acme"), await b.totals("acme")
        assert totals_a == totals_b
        assert totals_a.requests == 50
        assert totals_a.cost_usd == pytest.approx(0.5)
    finally:
        await a.stop()
        await b.stop()


async def test_records_are_held_while_the_server_is_down_and_written_once_it_is_back() -> None:
    async with private_ledger(interval_s=0.05, timeout_s=2.0) as (server, dsn, ledger):
        ledger.add(usage("before"))
        await ledger.committed()
        await asyncio.to_thread(server.stop)
        for i in range(20):
            ledger.add(usage(f"down{i}"))
            await ledger.committed()  # returns: the record is held
        assert ledger.backlog == 20
        assert ledger.unwritten_usd("acme") == pytest.approx(0.2)
        await asyncio.to_thread(server.start)
        deadline = time.monotonic() + 30
        while ledger.backlog:
            assert time.monotonic() < deadline, "the backlog was not written"
            await asyncio.sleep(0.05)
        got = await rows(dsn, "SELECT count(*) FROM usage")
        assert got[0][0] == 21
        totals = await ledger.totals("acme")
        assert (totals.requests, totals.cost_usd) == (21, pytest.approx(0.21))
        assert ledger.dropped == 0


async def test_stop_writes_what_is_waiting(pg_dsn: str) -> None:
    await open_check(pg_dsn)
    ledger = PostgresLedger(pg_dsn)
    ledger.start()
    for i in range(10):
        ledger.add(usage(f"r{i}"))
    await ledger.stop()  # without awaiting committed()
    got = await rows(pg_dsn, "SELECT count(*) FROM usage")
    assert got[0][0] == 10


async def test_replicas_starting_at_once_create_the_schema_once(pg_dsn: str) -> None:
    await asyncio.gather(*(open_check(pg_dsn) for _ in range(6)))
    got = await rows(pg_dsn, "SELECT version FROM tiergate_schema")
    assert [r[0] for r in got] == [SCHEMA_VERSION]


async def test_a_database_of_a_newer_schema_is_refused_in_one_line(pg_dsn: str) -> None:
    await open_check(pg_dsn)
    conn = await asyncpg.connect(pg_dsn)
    await conn.execute("UPDATE tiergate_schema SET version = $1", SCHEMA_VERSION + 1)
    await conn.close()
    with pytest.raises(LedgerError) as caught:
        await open_check(pg_dsn)
    message = str(caught.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message and "upgrade the router" in message
    assert "\n" not in message


async def test_a_wrong_password_is_one_line_without_the_password(
    postgres: PostgresServer,
) -> None:
    dsn = postgres.dsn(password="not-the-password")
    with pytest.raises(LedgerError) as caught:
        await open_check(dsn)
    message = str(caught.value)
    assert "password authentication failed" in message
    assert "not-the-password" not in message and "\n" not in message
    assert message.startswith(f"cannot open the usage ledger {where(dsn)}")


async def test_an_unreachable_server_is_one_line(postgres: PostgresServer) -> None:
    dsn = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/x"
    with pytest.raises(LedgerError) as caught:
        await open_check(dsn)
    assert "secret" not in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("password", ["xK9/aBcD", "Ab#cd", "Ab?cd"])
async def test_a_password_that_splits_the_url_is_one_line_without_any_of_it(
    password: str,
) -> None:
    """An unencoded / # or ? ends the URL's authority early: the parser's own error would
    quote the piece of the password it took for a port."""
    dsn = f"postgresql://ledger:{password}@127.0.0.1:{free_port()}/tiergate"
    with pytest.raises(LedgerError) as caught:
        await open_check(dsn)
    message = str(caught.value)
    assert "\n" not in message and "percent-encoded" in message, message
    for piece in (password[:2], password[-2:]):
        assert piece not in message and piece not in where(dsn), (message, where(dsn))


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        # A piece of the password a parser reads as a port (2024) and a path (/Winter!).
        ("postgresql://tiergate:2024/Winter!@db.prod:5432/ledger", AMBIGUOUS),
        ("postgresql://tiergate:a?b#c@db.prod/ledger", AMBIGUOUS),
        ("postgresql://tiergate:s3cret@db.prod:5432/ledger", "postgresql://db.prod:5432/ledger"),
        ("postgresql:///ledger", "postgresql://localhost/ledger"),
    ],
)
def test_messages_name_the_server_never_the_password(dsn: str, shown: str) -> None:
    assert where(dsn) == shown


async def test_a_write_that_committed_unseen_is_counted_once_when_written_again(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is lost after COMMIT (or a timeout fires while a standby confirms it):
    the router holds the record and writes it again, and the daily totals move once."""
    await open_check(pg_dsn)
    real = PostgresLedger._write
    lost: list[int] = []

    async def committed_then_lost(self: PostgresLedger, batch: Any, *, pooled: bool) -> None:
        await real(self, batch, pooled=pooled)
        if not pooled and not lost:
            lost.append(1)
            raise ConnectionResetError("the connection was lost after COMMIT")

    monkeypatch.setattr(PostgresLedger, "_write", committed_then_lost)
    ledger = PostgresLedger(pg_dsn)
    ledger.start()
    try:
        ledger.add(usage("once", tenant="unseen", cost=0.5))
        await ledger.committed()  # returns: the record is held, its write having "failed"
        assert lost and ledger.backlog == 1
        deadline = time.monotonic() + 30
        while ledger.backlog:
            assert time.monotonic() < deadline, "the backlog was not written"
            await asyncio.sleep(0.05)
        totals = await ledger.totals("unseen")
        assert (totals.requests, totals.cost_usd) == (1, pytest.approx(0.5))
        assert ledger.unwritten_usd("unseen") == 0.0
    finally:
        await ledger.stop()
