"""The PostgreSQL ledger's spool: records the database cannot take are fsynced to a local file
before `committed()` returns, a dead process's file is replayed (once, idempotently) by the
next one, a full spool refuses rather than serving unbilled, and an amendment made while the
backlog writer writes an older copy of a row is not lost.

Process death is real: a child process is SIGKILLed with records in its spool, or a router
worker of `tiergate router --workers 3` is, mid-burst, while PostgreSQL is stopped or its disk
is full (a tmpfs of its own, filled), before the database is back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import asyncpg
import httpx
import pytest
from fleet_clients import Reply, request
from fleet_helpers import tenant_yaml
from polling_helpers import until
from postgres_server import PostgresServer, started_server
from private_ledger import private_ledger
from process_helpers import Running, start_router, start_sim_node
from prometheus_client import CollectorRegistry, Counter, Histogram

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import TierChoice
from tiergate.router.ledger.postgres import PostgresLedger, open_check
from tiergate.router.ledger.records import LedgerError, UsageRecord
from tiergate.router.ledger.spool import LedgerSpool, Orphan, latest, spool_folder
from tiergate.router.request.accounting import Accountant
from tiergate.router.request.body import parse_completion
from tiergate.router.request.exchange import Exchange
from tiergate.router.request.progress import Progress
from tiergate.router.tenants.budgets import BudgetGuard
from tiergate.router.tenants.registry import Tenant

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

NOW = time.time()
#: The longest the routers may take to write what they spooled once the database is back.
WRITTEN_WITHIN_S = 60.0


def usage(request_id: str, *, cost: float = 0.01, completion: int = 10, latency: float = 0.1,
          outcome: str = "ok") -> UsageRecord:  # fmt: skip
    return UsageRecord(
        request_id=request_id, time_s=NOW, tenant="acme", tier_requested="batched",
        tier_served="batched", pool="p", endpoint="e", prompt_tokens=5,
        completion_tokens=completion, latency_s=latency, ttft_s=0.01, cost_usd=cost,
        http_status=200, outcome=outcome,  # type: ignore[arg-type]
    )  # fmt: skip


async def replayed(dsn: str, folder: Path) -> PostgresLedger:
    """A ledger started on `folder` until it has replayed the dead processes' files there (only
    its own file is left), then stopped."""
    ledger = PostgresLedger(dsn, interval_s=0.05, spool=LedgerSpool(folder, 10**6))
    ledger.start()
    try:
        until_done = time.monotonic() + WRITTEN_WITHIN_S
        while len(spool_files(folder)) > 1:
            assert time.monotonic() < until_done, "the dead processes' files were not replayed"
            await asyncio.sleep(0.05)
    finally:
        await ledger.stop()
    return ledger


async def fetch(dsn: str, sql: str) -> list[tuple[object, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(row) for row in await conn.fetch(sql)]
    finally:
        await conn.close()


def spool_files(folder: Path) -> list[Path]:
    """The spool files in `folder`, or in the folders of each database under it."""
    return sorted([*folder.glob("*.spool"), *folder.glob("*/*.spool")])


# The spool file alone.


def test_a_spool_refuses_what_would_take_it_past_its_size_and_keeps_what_it_has(
    tmp_path: Path,
) -> None:
    spool = LedgerSpool(tmp_path, max_bytes=1000)
    spool.open()
    assert spool.append([usage("a"), usage("b")])
    size = spool.bytes
    assert spool.path is not None and spool.path.stat().st_size == size
    assert not spool.append([usage(f"c{i}") for i in range(10)])  # would pass 1000 bytes
    assert (spool.bytes, spool.spooled, spool.refused) == (size, 2, 10)
    assert spool.path.stat().st_size == size
    spool.clear()
    assert spool.path.stat().st_size == 0
    spool.close(keep=False)
    assert spool_files(tmp_path) == []


def test_a_live_processs_file_is_never_taken_and_a_dead_ones_is(tmp_path: Path) -> None:
    """A child process spools two versions of one record and a line cut short, then is
    SIGKILLed: until it dies its file is not an orphan; after, it is, newest version first."""
    child = subprocess.Popen(
        [sys.executable, "-P", "-c", textwrap.dedent(f"""
            import os, pathlib, time
            from tiergate.router.ledger.records import UsageRecord
            from tiergate.router.ledger.spool import LedgerSpool

            def usage(request_id, completion, latency):
                return UsageRecord(request_id, {NOW}, "acme", "batched", "batched", "p", "e",
                                   5, completion, latency, 0.01, 0.01, 200, "ok")

            spool = LedgerSpool(pathlib.Path({str(tmp_path)!r}), 10**6)
            spool.open()
            spool.append([usage("s", 1, 0.1)])
            spool.append([usage("s", 40, 2.0), usage("t", 10, 0.1)])
            os.write(spool._fd, b'{{"request_id": "cut')  # a crash mid-write
            print("spooled", flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == b"spooled\n"
        mine = LedgerSpool(tmp_path, max_bytes=10**6)
        mine.open()
        assert list(mine.orphans()) == []  # its process holds it
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        (orphan,) = mine.orphans()
        assert orphan.unreadable == 1
        newest = {r.request_id: r.completion_tokens for r in latest(orphan.records)}
        assert newest == {"s": 40, "t": 10}
        assert list(mine.orphans()) == []  # locked by this caller until done
        orphan.done()
        assert spool_files(tmp_path) == [mine.path]
        mine.close(keep=False)
    finally:
        child.kill()
        child.wait(30)
        assert child.stdout is not None
        child.stdout.close()


def test_spool_files_of_another_database_url_are_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ledger's URL changed (its host spelt another way): the files spooled under the old
    one are in another folder, which no process replays. Each start names it and its count,
    so that an operator who knows it is the same database can move them."""
    old = LedgerSpool(spool_folder(tmp_path, "postgresql://10.0.0.5:5432/ledger"), 10**6)
    old.open()
    assert old.append([usage("stranded")])
    old.close(keep=True)
    caplog.set_level("WARNING", "tiergate.router")
    new = LedgerSpool(spool_folder(tmp_path, "postgresql://db.tiergate:5432/ledger"), 10**6)
    new.open()
    new.close(keep=False)
    assert f"event=ledger_spool_elsewhere folder={old.folder} files=1" in caplog.text
    caplog.clear()
    again = LedgerSpool(old.folder, 10**6)  # the old URL: its own folder is not a stray
    again.open()
    again.close(keep=False)
    assert "ledger_spool_elsewhere" not in caplog.text


# The ledger with its spool, on a real server.


async def test_records_the_database_cannot_take_are_on_disk_before_committed_returns(
    tmp_path: Path,
) -> None:
    spool = LedgerSpool(tmp_path, max_bytes=10**6)
    async with private_ledger(interval_s=0.05, timeout_s=2.0, spool=spool) as (server, dsn, led):
        led.add(usage("before"))
        await led.committed()
        assert spool.bytes == 0  # committed: nothing spooled
        await asyncio.to_thread(server.stop)
        entry = led.add(usage("down", completion=1, outcome="incomplete"))
        await led.committed()
        led.amend(entry, usage("down", completion=30, latency=1.0))  # held: spooled again
        await led.committed()
        assert spool.spooled == 2 and spool.path is not None
        assert spool.path.read_text().count('"request_id":"down"') == 2
        await asyncio.to_thread(server.start)
        until_written = time.monotonic() + WRITTEN_WITHIN_S
        while led.backlog or spool.bytes:
            assert time.monotonic() < until_written, "the spool was not written and cleared"
            await asyncio.sleep(0.05)
        got = await fetch(dsn, "SELECT request_id, completion_tokens FROM usage ORDER BY id")
        assert got == [("before", 10), ("down", 30)]


async def test_an_amendment_made_while_its_older_record_is_written_is_written_too(
    tmp_path: Path,
) -> None:
    """The backlog writer takes a held row's record, and while its write is in flight the row
    is amended (a stream's end): the amendment must reach the database."""
    spool = LedgerSpool(tmp_path, max_bytes=10**6)
    # A long interval: the test drives the backlog writer itself.
    async with private_ledger(interval_s=3600, timeout_s=2.0, spool=spool) as (server, dsn, led):
        await asyncio.to_thread(server.stop)
        entry = led.add(usage("s", completion=1, cost=0.001, outcome="incomplete"))
        await led.committed()
        assert led.backlog == 1
        await asyncio.to_thread(server.start)
        writing = asyncio.create_task(led._write_backlog())
        await asyncio.sleep(0)  # the writer has taken the old record and awaits the server
        led.amend(entry, usage("s", completion=40, cost=0.04, latency=2.0))
        assert await writing == 1
        await led.committed()  # the amendment, re-queued
        got = await fetch(dsn, "SELECT completion_tokens, cost_usd, outcome FROM usage")
        assert got == [(40, 0.04, "ok")]
        daily = await fetch(dsn, "SELECT completion_tokens, cost_usd FROM tenant_daily")
        assert daily == [(40, pytest.approx(0.04))]
        assert spool.bytes == 0


async def test_a_dead_processs_spool_is_replayed_once_with_its_newest_records(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """A process spools (the database refused it) and dies; a new ledger on the same folder
    writes the newest version of each row, moves the totals by the difference from what the
    database held, and replaying the same file again changes nothing."""
    dsn = postgres.dsn(postgres.create_database())
    await open_check(dsn)
    seed = PostgresLedger(dsn)
    seed.start()
    seed.add(usage("old", completion=1, cost=0.001, outcome="incomplete"))
    await seed.committed()
    await seed.stop()
    folder = tmp_path / "spool"
    folder.mkdir()
    dead = LedgerSpool(folder, max_bytes=10**6)
    dead.open()
    dead.append([usage("old", completion=20, cost=0.02, latency=1.0)])
    dead.append([usage("new", cost=0.5), usage("old", completion=5, cost=0.005, latency=0.5)])
    assert dead.path is not None
    copy = tmp_path / "copy"
    shutil.copy(dead.path, copy)
    os.close(dead._fd)  # type: ignore[arg-type]  # its process died: the lock is gone

    await replayed(dsn, folder)
    rows = "SELECT request_id, completion_tokens, cost_usd FROM usage ORDER BY request_id"
    totals = "SELECT requests, attempts, completion_tokens, cost_usd FROM tenant_daily"
    expected_rows = [("new", 10, 0.5), ("old", 20, 0.02)]
    expected_totals = [(2, 2, 30, pytest.approx(0.52))]
    assert await fetch(dsn, rows) == expected_rows
    assert await fetch(dsn, totals) == expected_totals
    shutil.copy(copy, folder / "99-replayed-again.spool")
    await replayed(dsn, folder)
    assert await fetch(dsn, rows) == expected_rows
    assert await fetch(dsn, totals) == expected_totals
    assert spool_files(folder) == []


async def test_a_full_spool_refuses_new_work_and_withholds_what_it_cannot_keep(
    tmp_path: Path,
) -> None:
    """Past 90% of the spool the ledger asks for new work to be refused; the requests already
    in flight still find room, and once the spool is full `committed()` says so."""
    spool = LedgerSpool(tmp_path, max_bytes=6000)  # about eighteen records
    async with private_ledger(interval_s=0.05, timeout_s=2.0, spool=spool) as (server, _, led):
        await asyncio.to_thread(server.stop)
        kept = 0
        while not led.refusing:
            led.add(usage(f"r{kept}"))
            await led.committed()
            kept += 1
            assert kept < 100, "never refusing"
        with pytest.raises(LedgerError, match="spool is full"):
            for _ in range(100):
                led.add(usage(f"r{kept}"))
                await led.committed()
                kept += 1
        assert spool.refused >= 1
        assert spool.bytes <= 6000
        await asyncio.to_thread(server.start)
        until_written = time.monotonic() + WRITTEN_WITHIN_S
        while led.refusing or led.backlog:
            assert time.monotonic() < until_written, "still refusing once the database is back"
            await asyncio.sleep(0.05)


# Real processes: a router with three workers.

ROUTER_CONFIG = """\
router:
  tenantsFile: {tenants}
  ledgerUrl: '{dsn}'
  ledgerSpoolDir: {spool}
pools:
  - {{name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, servedModelName: coder,
      batching: {{maxNumSeqs: 64}}, endpoints: [{node}],
      billing: {{outputPerMillionUsd: 1000, inputPerMillionUsd: 0}}}}
"""
#: The burst: this many requests, one every STAGGER_S, every other one a stream.
BURST = 200
STAGGER_S = 0.01
MAX_TOKENS = 40


def _node(folder: Path) -> Running:
    """The sim node behind the routers: the 8B model on a wafer, fast replies."""
    return start_sim_node(
        folder / "node.log", "--model", "llama-3.1-8b", "--accelerator", "wse-3",
        "--served-model-name", "coder", "--max-num-seqs", "64",
    )  # fmt: skip


def _router(
    folder: Path, dsn: str, node: str, *, workers: int, spool_max: str | None = None
) -> Running:
    """`tiergate router --workers N` on the PostgreSQL ledger `dsn`, its spool in
    `folder/spool` (of `spool_max` bytes, else the default), tenant gina, pool `node`."""
    tenants = folder / "tenants.yaml"
    tenants.write_text("tenants:\n" + tenant_yaml("gina"))
    config = ROUTER_CONFIG.format(tenants=tenants, dsn=dsn, spool=folder / "spool", node=node)
    if spool_max is not None:
        config = config.replace("router:\n", f"router:\n  ledgerSpoolMaxSize: {spool_max}\n", 1)
    path = folder / "router.yaml"
    path.write_text(config)
    return start_router(path, folder / "router.log", "--workers", str(workers))


@dataclass(frozen=True)
class Fault:
    """What takes the database away mid-burst, and what gives it back."""

    name: str
    data_mb: int | None
    #: What the router logs when it cannot write.
    logged: str
    begin: Callable[[PostgresServer], None]
    end: Callable[[PostgresServer], None]


FAULTS = [
    Fault(
        "restarted",
        None,
        "event=ledger_write_failed",
        lambda server: server.stop(),
        lambda server: server.start(),
    ),
    # Writes fail with "could not extend file" (SQLSTATE 53100) while the server stays up.
    Fault(
        "disk full",
        96,
        "No space left on device",
        lambda server: server.fill_disk(),
        lambda server: server.free_disk(),
    ),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[fault.name for fault in FAULTS])
def test_postgres_down_then_a_worker_killed_mid_burst_loses_no_reply_and_bills_none_twice(
    tmp_path: Path, fault: Fault
) -> None:
    """PostgreSQL stops (or its disk fills) mid-burst; the workers serve on, their records
    spooled; one worker that holds records is SIGKILLed; PostgreSQL comes back. Every reply a
    client had whole is in the ledger at what the client was told it cost, and the daily totals
    are the rows' sums."""
    server = started_server("tiergate-pg-spool-", data_mb=fault.data_mb)
    spool = tmp_path / "spool"
    node = _node(tmp_path)
    try:
        dsn = server.dsn(server.create_database())
        router = _router(tmp_path, dsn, node.url, workers=3)
        try:
            replies, killed = asyncio.run(_burst_through_a_fault(router.url, server, spool, fault))
            had = {r.request_id: r.cost_usd for r in replies if r.whole}

            def all_written() -> bool:
                rows = dict(asyncio.run(fetch(dsn, "SELECT request_id, cost_usd FROM usage")))
                return set(had) <= set(rows)

            until(all_written, "whole replies are missing from the ledger", WRITTEN_WITHIN_S)
            until(lambda: not spool_files(spool) or all(
                f.stat().st_size == 0 for f in spool_files(spool)
            ), "the spool was not replayed", WRITTEN_WITHIN_S)  # fmt: skip
        finally:
            router.stop()
        rows = dict(asyncio.run(fetch(dsn, "SELECT request_id, cost_usd FROM usage")))
        ((daily_usd, daily_requests),) = asyncio.run(
            fetch(dsn, "SELECT SUM(cost_usd), SUM(requests) FROM tenant_daily")
        )
        log = (tmp_path / "router.log").read_text()
    finally:
        node.stop()
        server.close()
    assert f"pid={killed} code=-9 signal=SIGKILL" in log
    assert "event=ledger_spool_replayed" in log
    assert fault.logged in log
    whole_while_down = [r for r in replies if r.whole and r.answered_in == "down"]
    assert whole_while_down, "no reply went out while the database was down"
    for request_id, cost in had.items():
        assert rows[request_id] == pytest.approx(cost), request_id
    assert daily_requests == len(rows)  # every row counted once
    assert daily_usd == pytest.approx(sum(rows.values()))  # and its cost once


async def _burst_through_a_fault(
    url: str, server: PostgresServer, spool: Path, fault: Fault
) -> tuple[list[Reply], int]:
    """The burst, with the fault begun after 20 whole replies, a worker holding spooled records
    SIGKILLed once 20 more came back and some worker spooled, and the fault ended; the replies
    and the killed worker's pid."""
    phase = ["up"]
    replies: list[Reply] = []
    changed = asyncio.Event()

    async def one(http: httpx.AsyncClient, i: int) -> None:
        await asyncio.sleep(i * STAGGER_S)
        reply = Reply(0, bool(i % 2), "gina", sent_in=phase[0])
        await request(http, url, MAX_TOKENS, reply)
        reply.answered_in = phase[0]
        replies.append(reply)
        changed.set()

    def holding() -> list[Path]:
        return [f for f in spool_files(spool) if f.stat().st_size > 0]

    async def whole(count: int, *, spooled: bool = False) -> None:
        async with asyncio.timeout(WRITTEN_WITHIN_S):
            while sum(r.whole for r in replies) < count or (spooled and not holding()):
                changed.clear()
                await changed.wait()

    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        burst = asyncio.gather(*(one(http, i) for i in range(BURST)))
        await whole(20)
        await asyncio.to_thread(fault.begin, server)
        phase[0] = "down"
        try:
            await whole(sum(r.whole for r in replies) + 20, spooled=True)
        except TimeoutError:
            raise AssertionError("no worker spooled while the database was down") from None
        killed = int(holding()[0].name.split("-")[0])
        os.kill(killed, signal.SIGKILL)
        phase[0] = "killed"
        await asyncio.to_thread(fault.end, server)
        phase[0] = "up again"
        await burst
    return replies, killed


#: The smallest spool the router takes (64 KiB): it refuses past 90%, some 160 records.
SMALL_SPOOL = "64Ki"


def test_a_router_whose_spool_is_full_refuses_with_503_and_leaves_nothing_served_unbilled(
    tmp_path: Path,
) -> None:
    """PostgreSQL stopped, one worker with the smallest spool: it serves (and spools) until the
    spool is nearly full, then answers 503 `ledger_unavailable` before reading a body. Once the
    database is back it serves again, and every reply a client had whole is billed, once."""
    server = started_server("tiergate-pg-spool-")
    node = _node(tmp_path)
    try:
        dsn = server.dsn(server.create_database())
        router = _router(tmp_path, dsn, node.url, workers=1, spool_max=SMALL_SPOOL)
        try:
            replies = asyncio.run(_until_refused(router.url, server))
            had = {r.request_id: r.cost_usd for r in replies if r.whole}

            def all_written() -> bool:
                rows = dict(asyncio.run(fetch(dsn, "SELECT request_id, cost_usd FROM usage")))
                return set(had) <= set(rows)

            until(all_written, "whole replies are missing from the ledger", WRITTEN_WITHIN_S)
            after = asyncio.run(_one(router.url))
        finally:
            router.stop()
        rows = dict(asyncio.run(fetch(dsn, "SELECT request_id, cost_usd FROM usage")))
        ((daily_requests,),) = asyncio.run(fetch(dsn, "SELECT SUM(requests) FROM tenant_daily"))
        log = (tmp_path / "router.log").read_text()
    finally:
        node.stop()
        server.close()
    refused = [r for r in replies if r.status == 503]
    assert refused, "the router never refused"
    assert {r.code for r in refused} == {"ledger_unavailable"}
    assert all(not r.whole for r in refused)
    assert [r.status for r in replies if r.failure is None and r.status not in (200, 503)] == []
    served_down = [r for r in replies if r.whole]
    assert len(served_down) >= 100, "the spool took far fewer records than its size allows"
    for request_id, cost in had.items():
        assert rows[request_id] == pytest.approx(cost), request_id
    assert after.whole, f"not served once the database was back: {after}"
    assert daily_requests == len(rows)  # every row counted once
    assert log.count("event=ledger_refusing_new_work") == 1
    assert log.count("event=ledger_accepting_new_work") == 1


async def _until_refused(url: str, server: PostgresServer) -> list[Reply]:
    """PostgreSQL stopped, then requests 8 at a time until 16 of them were refused, and
    PostgreSQL started again; the replies."""
    await asyncio.to_thread(server.stop)
    replies: list[Reply] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for _batch in range(100):
            sent = [Reply(0, bool(i % 2), "gina") for i in range(8)]
            await asyncio.gather(*(request(http, url, MAX_TOKENS, r) for r in sent))
            replies += sent
            if sum(r.status == 503 for r in replies) >= 16:
                break
        else:
            raise AssertionError("800 requests and never 16 refusals")
    await asyncio.to_thread(server.start)
    return replies


async def _one(url: str) -> Reply:
    """One request, retried while the router still refuses (until its spool is replayed)."""
    async with httpx.AsyncClient(timeout=30) as http:
        deadline = time.monotonic() + WRITTEN_WITHIN_S
        while True:
            reply = await request(http, url, MAX_TOKENS, Reply(0, False, "gina"))
            if reply.code != "ledger_unavailable" or time.monotonic() > deadline:
                return reply
            await asyncio.sleep(0.2)


async def test_a_dead_processs_streams_are_closed_once_its_lease_expires(
    tmp_path: Path, pg_dsn: str
) -> None:
    """A process that dies mid-stream leaves its row `incomplete`; once its lease has expired
    another process closes it as `interrupted`, billed as it stands. A live process's stream
    is left alone."""
    await open_check(pg_dsn)
    child = subprocess.Popen(
        [sys.executable, "-P", "-c", textwrap.dedent(f"""
            import asyncio, time
            from tiergate.router.ledger.postgres import PostgresLedger
            from tiergate.router.ledger.records import UsageRecord

            async def main():
                ledger = PostgresLedger({pg_dsn!r}, lease_ttl_s=1.0, interval_s=0.05)
                ledger.start()
                ledger.add(UsageRecord("dead", {NOW}, "acme", "batched", "batched", "p", "e",
                                       5, 7, 0.5, 0.01, 0.007, 200, "incomplete"))
                await ledger.committed()
                await asyncio.sleep(0.5)  # its lease renewed at its start
                print("streaming", flush=True)
                await asyncio.sleep(600)

            asyncio.run(main())
        """)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    alive = PostgresLedger(pg_dsn, interval_s=0.05, sweep_interval_s=0.1)
    alive.start()
    try:
        assert child.stdout is not None and child.stdout.readline() == b"streaming\n"
        alive.add(usage("alive", completion=3, cost=0.003, outcome="incomplete"))
        await alive.committed()
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        sql = "SELECT request_id, outcome, completion_tokens, cost_usd FROM usage ORDER BY 1"
        until_closed = time.monotonic() + WRITTEN_WITHIN_S
        while (await fetch(pg_dsn, sql))[1][1] != "interrupted":
            assert time.monotonic() < until_closed, "the dead process's row was not closed"
            await asyncio.sleep(0.05)
        assert await fetch(pg_dsn, sql) == [
            ("alive", "incomplete", 3, 0.003),
            ("dead", "interrupted", 7, 0.007),
        ]
        assert alive.swept == 1
        daily = await fetch(pg_dsn, "SELECT completion_tokens, cost_usd FROM tenant_daily")
        assert daily == [(10, pytest.approx(0.01))]
    finally:
        child.kill()
        child.wait(30)
        assert child.stdout is not None
        child.stdout.close()
        await alive.stop()


async def outage_past_the_backlog(led: PostgresLedger, server: PostgresServer) -> None:
    """Stop the database and record r0, r1, r2 with room for two in memory: r2 is on disk
    only, and its $0.01 is counted as not yet written."""
    led.max_backlog = 2
    await asyncio.to_thread(server.stop)
    for i in range(3):
        led.add(usage(f"r{i}"))
        await led.committed()
    assert (led.backlog, led.on_disk_only, led.dropped) == (2, 1, 0)
    assert led.unwritten_usd("acme") == pytest.approx(0.03)


async def test_a_backlog_that_let_records_go_to_disk_writes_them_from_there_once_back(
    tmp_path: Path,
) -> None:
    """The database was away so long that the backlog in memory filled, and the spool grew past
    the point where new work is refused. Once the database is back, the process writes what is
    on disk only from its file, empties its spool, and takes new work again, with no restart."""
    spool = LedgerSpool(tmp_path, max_bytes=10**6)
    async with private_ledger(interval_s=0.05, timeout_s=2.0, spool=spool) as (server, dsn, led):
        await outage_past_the_backlog(led, server)
        spool.max_bytes = spool.bytes  # as if the outage had filled it
        assert led.refusing
        await asyncio.to_thread(server.start)
        until_written = time.monotonic() + WRITTEN_WITHIN_S
        while led.backlog or led.on_disk_only:
            assert time.monotonic() < until_written, "what was on disk only was not written"
            await asyncio.sleep(0.05)
        assert not led.refusing and spool.bytes == 0
        assert spool_files(tmp_path) == [spool.path]
        got = await fetch(dsn, "SELECT request_id FROM usage ORDER BY request_id")
        assert got == [("r0",), ("r1",), ("r2",)]
        daily = await fetch(dsn, "SELECT requests, cost_usd FROM tenant_daily")
        assert daily == [(3, pytest.approx(0.03))]
        assert led.unwritten_usd("acme") == 0
        assert led.committed_usd("acme") == pytest.approx(0.03)
        assert (led.replayed, led.dropped) == (1, 0)


async def drained(led: PostgresLedger) -> None:
    """What the backlog writer does, round after round, until nothing is held or on disk."""
    for _ in range(10):
        while led.backlog and await led._write_backlog():
            pass
        await led._write_rotated()
        if not (led.backlog or led.on_disk_only):
            return
    raise AssertionError("the backlog writer left records unwritten")


async def test_a_replayed_file_that_cannot_be_deleted_is_settled_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process wrote the records a full backlog let go of from its former spool file, but
    the file cannot be deleted (a volume turned read-only): the records are in the database, so
    budgets count them as written; the file left is replayed again, in vain."""

    def undeletable(orphan: Orphan) -> None:
        os.close(orphan.fd)
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Orphan, "done", undeletable)
    spool = LedgerSpool(tmp_path, max_bytes=10**6)
    async with private_ledger(interval_s=3600, timeout_s=2.0, spool=spool) as (server, dsn, led):
        await outage_past_the_backlog(led, server)
        await asyncio.to_thread(server.start)
        await drained(led)
        assert led.unwritten_usd("acme") == 0
        assert led.committed_usd("acme") == pytest.approx(0.03)
        assert await fetch(dsn, "SELECT requests FROM tenant_daily") == [(3,)]


@pytest.mark.parametrize("amended", ["before", "during", "after"])
async def test_a_stream_let_go_to_disk_and_amended_is_billed_once(
    tmp_path: Path, amended: str
) -> None:
    """A stream's row is let go to disk while it is still open; its end is recorded before,
    while, or after the process writes its file: its row and the day's totals say the end's
    cost once, not the end's plus the start's. (Written while the file was, neither write
    found a row: both inserted, and the attempt was counted twice.)"""
    spool = LedgerSpool(tmp_path, max_bytes=10**6)
    # A long interval: the test drives the backlog writer itself.
    async with private_ledger(interval_s=3600, timeout_s=2.0, spool=spool) as (server, dsn, led):
        led.max_backlog = 0
        await asyncio.to_thread(server.stop)
        entry = led.add(usage("s", completion=1, cost=0.001, outcome="incomplete"))
        await led.committed()
        assert (led.backlog, led.on_disk_only) == (0, 1)
        await asyncio.to_thread(server.start)
        led.add(usage("next"))
        await led.committed()  # written: the spool's file is handed over
        assert led._rotated is not None
        end = usage("s", completion=40, cost=0.04, latency=2.0)
        if amended == "before":
            led.amend(entry, end)
            await led.committed()
        if amended == "during":
            led.amend(entry, end)
            await asyncio.gather(led._write_rotated(), led.committed())
        await drained(led)
        if amended == "after":
            # Its stream still going, the row is this process's: no sweep closes it.
            row = await fetch(dsn, "SELECT holder, outcome FROM usage WHERE request_id = 's'")
            assert row == [(led.holder, "incomplete")]
            led.amend(entry, end)
            await led.committed()
            await drained(led)
        got = await fetch(dsn, "SELECT request_id, cost_usd, outcome FROM usage ORDER BY id")
        assert sorted(got) == [("next", 0.01, "ok"), ("s", 0.04, "ok")]
        daily = await fetch(dsn, "SELECT requests, completion_tokens, cost_usd FROM tenant_daily")
        assert daily == [(2, 50, pytest.approx(0.05))]
        assert led.unwritten_usd("acme") == 0
        assert led.committed_usd("acme") == pytest.approx(0.05)
        assert spool.bytes == 0 and led.on_disk_only == 0


class AmendedWhileAppending(LedgerSpool):
    """A spool whose next append lets the event loop run `amend` before it returns: a
    stream's end recorded while its start is being fsynced."""

    amend: Callable[[], None] | None = None
    loop: asyncio.AbstractEventLoop

    def append(self, records: list[UsageRecord]) -> bool:
        appended = super().append(records)
        amend, self.amend = self.amend, None
        if amend is not None:
            ran = threading.Event()
            self.loop.call_soon_threadsafe(lambda: (amend(), ran.set()))
            assert ran.wait(10), "the event loop did not run the amendment"
        return appended


async def test_a_row_whose_end_the_full_spool_refused_leaves_its_start_to_disk_and_recovers(
    tmp_path: Path,
) -> None:
    """Memory full, a stream's start is spooled while its end is recorded; the end then finds
    the spool full too. The start, on disk, is written from the file once the database is
    back; the end is dropped and counted. The spool empties and the process takes work again
    without a restart (the entry used to stay counted as spooled and unwritten, so the spool
    was never emptied and every request got 503 until a restart)."""
    spool = AmendedWhileAppending(tmp_path, max_bytes=10**6)
    async with private_ledger(interval_s=3600, timeout_s=2.0, spool=spool) as (server, dsn, led):
        spool.loop = asyncio.get_running_loop()
        led.max_backlog = 0
        await asyncio.to_thread(server.stop)
        start = usage("s", completion=1, cost=0.001, outcome="incomplete")
        entry = led.add(start)
        end = usage("s", completion=40, cost=0.04, latency=2.0)
        spool.amend = lambda: led.amend(entry, end)
        await led.committed()  # the start spooled, and let go to disk; the end queued
        spool.max_bytes = spool.bytes  # as if the outage had filled it
        with pytest.raises(LedgerError, match="the spool is full"):
            await led.committed()  # the end: refused by the spool, no room in memory
        assert led.refusing and led.dropped == 1 and led.on_disk_only == 1
        await asyncio.to_thread(server.start)
        spool.max_bytes = 10**6
        led.add(usage("next"))
        await led.committed()  # written: the spool's file is handed over
        await drained(led)
        assert not led.refusing and spool.bytes == 0 and led.on_disk_only == 0
        got = await fetch(dsn, "SELECT request_id, cost_usd, outcome FROM usage ORDER BY id")
        assert sorted(got) == [("next", 0.01, "ok"), ("s", 0.001, "incomplete")]
        assert led.unwritten_usd("acme") == 0
        assert led.committed_usd("acme") == pytest.approx(0.011)
        # The stream goes on and ends later: its row and the day's totals say its end, and
        # nothing is counted as unwritten twice. (What this process counts as committed
        # moves from the dropped record, $0.04: the database's $0.049 is what a budget's next
        # lease reads.)
        led.amend(entry, usage("s", completion=50, cost=0.05, latency=3.0))
        await led.committed()
        got = await fetch(dsn, "SELECT request_id, cost_usd FROM usage ORDER BY request_id")
        assert got == [("next", 0.01), ("s", 0.05)]
        daily = await fetch(dsn, "SELECT requests, cost_usd FROM tenant_daily")
        assert daily == [(2, pytest.approx(0.06))]
        assert led.unwritten_usd("acme") == pytest.approx(0)
        assert led.committed_usd("acme") == pytest.approx(0.011 + 0.01)


async def test_records_on_disk_only_at_a_clean_stop_are_written_by_the_next_process(
    tmp_path: Path,
) -> None:
    """The process stops while the database is still away: the file holding what the backlog
    let go of stays, and the next process writes it, once."""
    spool = LedgerSpool(tmp_path, max_bytes=10**6)
    async with private_ledger(interval_s=0.05, timeout_s=2.0, spool=spool) as (server, dsn, led):
        await outage_past_the_backlog(led, server)
        await led.stop()
        assert spool_files(tmp_path), "the spool holding r2 was deleted"
        await asyncio.to_thread(server.start)
        await replayed(dsn, tmp_path)
        got = await fetch(dsn, "SELECT request_id FROM usage ORDER BY request_id")
        assert got == [("r0",), ("r1",), ("r2",)]
        daily = await fetch(dsn, "SELECT requests, cost_usd FROM tenant_daily")
        assert daily == [(3, pytest.approx(0.03))]


def accountant(ledger: PostgresLedger) -> Accountant:
    registry = CollectorRegistry()
    metrics = SimpleNamespace(
        requests=Counter("requests", "", ["requested", "served", "outcome"], registry=registry),
        ttft=Histogram("ttft", "", ["tier"], registry=registry),
        cost=Counter("cost", "", ["tier"], registry=registry),
        tokens=Counter("tokens", "", ["tier", "kind"], registry=registry),
        accounting_errors=Counter("accounting_errors", "", registry=registry),
        ledger_refusals=Counter("ledger_refusals", "", registry=registry),
    )
    budgets = BudgetGuard(ledger, clock=time.time)  # type: ignore[arg-type]
    limits = SimpleNamespace(settle=lambda *_: None)
    return Accountant(ledger, budgets, limits, metrics, time.monotonic, time.time)  # type: ignore[arg-type]


def served(request_id: str, *, stream: bool) -> Exchange:
    """A request of tenant acme served whole (or as a stream), 10 output tokens for $0.20."""
    ex = Exchange(request_id, time.monotonic(), {}, receive=None, send=None)  # type: ignore[arg-type]
    ex.tenant = Tenant("acme")
    body = {"model": "m", "prompt": "hi", "max_tokens": 10, "stream": stream}
    ex.request = parse_completion(json.dumps(body).encode(), chat=False)
    ex.choice = TierChoice("batched", "default", "standard", may_fall_back=False)
    ex.done = Progress(outcome="ok", status=200, tier_served="batched", endpoint="e",
                       prompt_tokens=5, completion_tokens=10, cost_usd=0.2)  # fmt: skip
    return ex


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_withheld_for_a_full_spool_is_billed_only_for_what_the_client_had(
    tmp_path: Path, stream: bool
) -> None:
    """The database is away and the spool full: the reply's end does not go out. A whole
    reply the client never had is recorded as a 503 and billed nothing, so a client that
    retries it pays once; a stream is billed for the tokens it relayed, which the client has."""
    spool = LedgerSpool(tmp_path, max_bytes=64)  # takes no record
    async with private_ledger(interval_s=0.05, timeout_s=2.0, spool=spool) as (server, dsn, led):
        await asyncio.to_thread(server.stop)
        with pytest.raises(RouterError) as refused:
            await accountant(led).settle(served("withheld", stream=stream))
        assert (refused.value.status, refused.value.code) == (503, "ledger_unavailable")
        await asyncio.to_thread(server.start)
        until_written = time.monotonic() + WRITTEN_WITHIN_S
        while led.backlog:
            assert time.monotonic() < until_written, "the held record was not written"
            await asyncio.sleep(0.05)
        got = await fetch(
            dsn, "SELECT http_status, outcome, completion_tokens, cost_usd FROM usage"
        )
        assert got == [(200, "error", 10, 0.2) if stream else (503, "error", 10, 0.0)]
        daily = await fetch(dsn, "SELECT requests, cost_usd FROM tenant_daily")
        assert daily == [(1, pytest.approx(0.2 if stream else 0.0))]


async def test_a_record_the_database_never_takes_does_not_hold_a_replay_back(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """A dead process's file holds a line whose count is not one (edited by hand, or written
    by another version) and a record the database refuses whatever is tried (a count past its
    bigint): the first is unreadable, the second dropped and counted, the file's other records
    are written, and the files after it are replayed."""
    dsn = postgres.dsn(postgres.create_database())
    await open_check(dsn)
    folder = tmp_path / "spool"
    for name, records in (
        ("1-first", [usage("a"), dataclasses.replace(usage("bad"), prompt_tokens="many"),
                     dataclasses.replace(usage("huge"), prompt_tokens=2**63), usage("b")]),
        ("2-second", [usage("c")]),
    ):  # fmt: skip
        dead = LedgerSpool(folder, max_bytes=10**6)
        dead.open()
        assert dead.append(records)  # type: ignore[arg-type]
        assert dead.path is not None
        dead.path.rename(folder / f"{name}.spool")
        os.close(dead._fd)  # type: ignore[arg-type]  # its process died: the lock is gone
        time.sleep(0.01)  # the files are replayed oldest first
    ledger = await replayed(dsn, folder)
    got = await fetch(dsn, "SELECT request_id FROM usage ORDER BY request_id")
    assert got == [("a",), ("b",), ("c",)]
    assert ledger.dropped == 1
