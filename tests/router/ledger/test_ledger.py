"""The usage ledger: what it records, its totals, its schema, and durability under SIGKILL."""

import contextlib
import dataclasses
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tiergate.router.ledger.checkpoint import Checkpointer
from tiergate.router.ledger.sqlite import (
    PAGE_SIZE,
    SCHEMA_VERSION,
    WAL_SIZE_LIMIT,
    Ledger,
    LedgerError,
    UsageRecord,
    utc_day,
)

T0 = 1_800_000_000.0


def usage(**changes: Any) -> UsageRecord:
    record = UsageRecord(
        request_id="req-1",
        time_s=T0,
        tenant="team-a",
        tier_requested="batched",
        tier_served="batched",
        pool="fr-batched",
        endpoint="http://127.0.0.1:9000",
        prompt_tokens=1000,
        completion_tokens=200,
        latency_s=3.2,
        ttft_s=0.4,
        cost_usd=0.01,
        http_status=200,
        outcome="ok",
    )
    return dataclasses.replace(record, **changes)


def test_rows_hold_every_field() -> None:
    with Ledger(":memory:") as ledger:
        record = usage(ttft_s=None, escalated=True, attempt=2, outcome="client_disconnect")
        ledger.record(record)
        row = ledger._db.execute(
            "SELECT request_id, attempt, time_s, tenant, tier_requested, tier_served, pool,"
            " endpoint, prompt_tokens, completion_tokens, latency_s, ttft_s, cost_usd,"
            " http_status, outcome, escalated FROM usage"
        ).fetchone()
    assert row == (
        "req-1", 2, T0, "team-a", "batched", "batched", "fr-batched", "http://127.0.0.1:9000",
        1000, 200, 3.2, None, 0.01, 200, "client_disconnect", 1,
    )  # fmt: skip


def test_totals_by_tier_served_and_a_billed_cascade() -> None:
    with Ledger(":memory:") as ledger:
        ledger.record(usage(request_id="r1"))
        # A cascade: wafer-scale first, escalated to premium; both attempts billed.
        cascade = usage(request_id="r2", tier_requested="wafer-scale", escalated=True)
        ledger.record(dataclasses.replace(cascade, tier_served="wafer-scale", cost_usd=0.02))
        ledger.record(dataclasses.replace(cascade, tier_served="premium", attempt=2, cost_usd=0.06))
        ledger.record(usage(request_id="r3", tier_served=None, pool=None, endpoint=None,
                            prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
                            http_status=429, outcome="shed"))  # fmt: skip
        ledger.record(usage(request_id="r4", tenant="team-b", cost_usd=5.0))
        totals = ledger.tenant_totals("team-a")
        assert (totals.requests, totals.attempts) == (3, 4)
        assert (totals.prompt_tokens, totals.completion_tokens) == (3000, 600)
        assert totals.cost_usd == pytest.approx(0.09)
        assert sorted(totals.by_tier_served) == ["batched", "premium", "wafer-scale"]
        premium = totals.by_tier_served["premium"]
        assert (premium.requests, premium.prompt_tokens, premium.cost_usd) == (1, 1000, 0.06)
        assert ledger.tenant_totals("nobody").requests == 0


def test_spend_in_days_reads_whole_utc_days() -> None:
    day = utc_day(T0)
    with Ledger(":memory:") as ledger:
        for n in range(5):  # one attempt a day, the last at 23:59:59 UTC
            ledger.record(
                usage(request_id=f"r{n}", time_s=(day + n + 1) * 86400.0 - 1, cost_usd=1.0)
            )
        ledger.record(usage(tenant="team-b", cost_usd=100.0))
        assert ledger.spend_in_days("team-a", day + 1) == 4.0
        assert ledger.spend_in_days("team-a", day + 1, day + 3) == 2.0
        assert ledger.spend_in_days("team-a", day + 10) == 0.0
        assert ledger.spend_in_days("team-a", 0) == 5.0
        assert ledger.spend_in_days("team-b", day, day + 1) == 100.0


def test_schema_is_created_once_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        ledger.record(usage())
        assert ledger._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert ledger._db.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    with Ledger(path) as ledger:
        versions = ledger._db.execute("SELECT version FROM schema_version").fetchall()
        assert versions == [(SCHEMA_VERSION,)]
        assert ledger.tenant_totals("team-a").requests == 1


def wal_frames(db_path: Path) -> int:
    """Frames (pages) the WAL file has room for: a 32-byte header, then 24 + page size each."""
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
    wal = db_path.with_name(db_path.name + "-wal")
    return max(0, wal.stat().st_size - 32) // (24 + page_size) if wal.exists() else 0


def test_checkpoints_run_off_the_recording_connection(tmp_path: Path) -> None:
    """`record` never runs a checkpoint (a 3-7 ms stall of the event loop): with SQLite's
    automatic checkpoints off, what it commits stays in the WAL until the thread folds it."""
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        assert ledger._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        assert ledger._checkpointer is not None
        ledger._checkpointer.stop()  # nothing but `record` may touch the file from here
        for n in range(3000):  # ~3 WAL pages each: past SQLite's default 1000-page trigger
            ledger.record(usage(request_id=f"r{n}"))
        # Checkpointed every 1000 pages, the WAL would be reused and stay near 1000 frames.
        assert wal_frames(path) > 5000, "a record ran a checkpoint"
        assert ledger.wal_bytes() == (tmp_path / "ledger.db-wal").stat().st_size
    with Ledger(path) as reopened:
        assert reopened.tenant_totals("team-a").requests == 3000


def test_the_wal_starts_over_while_records_keep_coming(tmp_path: Path) -> None:
    """Under steady load a commit always lands while a passive checkpoint runs, and the WAL
    only starts over when a commit finds all of it copied: without the RESTART pass it grew
    by every record, forever. Records here come in bursts of 10 with 1 ms between (a busy
    router's pace), the checkpoint thread running every 20 ms."""
    path = tmp_path / "ledger.db"
    records = 6000
    with Ledger(
        path, checkpoint_interval_s=0.02, restart_frames=200, wal_size_limit=256 * 1024
    ) as ledger:
        largest = 0
        for n in range(records):
            ledger.record(usage(request_id=f"r{n}"))
            if n % 10 == 9:
                largest = max(largest, ledger.wal_bytes())
                time.sleep(0.001)
        (pages,) = ledger._db.execute("PRAGMA page_size").fetchone()
    unbounded = records * 3 * (24 + pages)  # ~3 frames a record, never reused
    assert largest < unbounded / 4, f"the WAL reached {largest:,} bytes"
    with Ledger(path) as reopened:
        assert reopened.tenant_totals("team-a").requests == records


def test_a_restart_pass_waits_for_a_transaction_in_progress(tmp_path: Path) -> None:
    """The RESTART pass holds the writer back only between transactions: it waits for (and
    never breaks) one in progress, and the commit after it starts the WAL over."""
    path = tmp_path / "ledger.db"
    with Ledger(path, checkpoint_interval_s=3600, restart_frames=1) as ledger:
        for n in range(500):
            ledger.record(usage(request_id=f"r{n}"))
        assert ledger._checkpointer is not None
        checkpointer = ledger._checkpointer
        before = wal_frames(path)
        ledger._db.execute("BEGIN IMMEDIATE")  # a writer mid-transaction
        ran = threading.Event()

        def round_() -> None:
            db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
            with contextlib.closing(db):
                checkpointer.checkpoint(db)
            ran.set()

        thread = threading.Thread(target=round_)
        thread.start()
        assert not ran.wait(0.2), "the RESTART pass did not wait for the writer"
        ledger._db.execute("COMMIT")
        thread.join(10)
        assert ran.is_set()
        ledger.record(usage(request_id="after"))
        # The commit after the restart wrote from the WAL's start: a few frames, not 1,500.
        frames_now = ledger._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        assert frames_now < 10 < before
        assert ledger.tenant_totals("team-a").requests == 501


def test_a_wal_grown_while_checkpoints_could_not_run_is_cut_back(tmp_path: Path) -> None:
    """While checkpoints cannot finish (a full disk, a long reader; here: none runs) the WAL
    grows with every record. Once they run again the WAL is copied and restarted, and a file
    longer than the ledger's keep size is cut to nothing: below the size limit SQLite reuses
    a WAL file, never shrinks it, so a small volume stayed full after the episode."""
    path = tmp_path / "ledger.db"
    wal = tmp_path / "ledger.db-wal"
    keep = 128 * 1024
    with Ledger(path, checkpoint_interval_s=0.02, restart_frames=50, wal_keep_bytes=keep) as ledger:
        assert ledger._checkpointer is not None
        ledger._checkpointer.stop()
        for n in range(1500):
            ledger.record(usage(request_id=f"r{n}"))
        grown = wal.stat().st_size
        assert grown > 8 * keep, f"the WAL did not grow: {grown:,} bytes"
        ledger._checkpointer = Checkpointer(str(path), 0.02, 50, keep)  # checkpoints again
        deadline = time.monotonic() + 30
        n = 0
        while wal.stat().st_size > keep and time.monotonic() < deadline:
            ledger.record(usage(request_id=f"later-{n}"))  # a light load goes on
            n += 1
            time.sleep(0.01)
        assert wal.stat().st_size <= keep, f"the WAL stayed at {wal.stat().st_size:,} bytes"
        assert ledger.backlog == 0
        assert ledger.tenant_totals("team-a").requests == 1500 + n


def test_a_new_ledger_has_small_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    with Ledger(tmp_path / "new.db") as ledger:
        assert ledger._db.execute("PRAGMA page_size").fetchone() == (PAGE_SIZE,)
        assert ledger._db.execute("PRAGMA journal_size_limit").fetchone() == (WAL_SIZE_LIMIT,)
    old = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(old)) as db:
        db.execute("PRAGMA page_size=4096")
        db.execute("CREATE TABLE other (x)")
        db.commit()
    with Ledger(old) as ledger:
        ledger.record(usage())
        assert ledger._db.execute("PRAGMA page_size").fetchone() == (4096,)
        assert ledger.tenant_totals("team-a").requests == 1


def test_closing_the_ledger_stops_its_checkpoint_thread(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    checkpointer = ledger._checkpointer
    assert checkpointer is not None and checkpointer._thread.is_alive()
    ledger.close()
    assert not checkpointer._thread.is_alive()
    assert Ledger(":memory:")._checkpointer is None


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.close()
    with pytest.raises(LedgerError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Ledger(path)


def test_unopenable_path_is_a_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="cannot open"):
        Ledger(tmp_path / "missing-dir" / "ledger.db")


def test_the_ledger_can_be_handed_to_another_thread() -> None:
    """Built on the CLI's thread, used on the event loop's (uvicorn may run it elsewhere)."""
    ledger = Ledger(":memory:")
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            ledger.record(usage())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert not errors
    assert ledger.tenant_totals(usage().tenant).requests == 1
    ledger.close()


_WRITER = """
import sys
from tiergate.router.ledger.sqlite import Ledger, UsageRecord

ledger = Ledger(sys.argv[1])
for i in range(int(sys.argv[2])):
    ledger.record(UsageRecord(
        request_id=f"req-{i}", time_s=1.8e9 + i, tenant="team-a", tier_requested="premium",
        tier_served="premium", pool="p", endpoint="e", prompt_tokens=10, completion_tokens=i,
        latency_s=0.1, ttft_s=0.01, cost_usd=0.001, http_status=200, outcome="ok"))
print("written", flush=True)
sys.stdin.read()  # the parent kills us while we hold the connection open
"""


def test_sigkill_right_after_recording_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    records = 500
    writer = subprocess.Popen(
        [sys.executable, "-P", "-c", _WRITER, str(path), str(records)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        ready, _, _ = select.select([writer.stdout], [], [], 60.0)
        assert ready, "the writer did not report within 60 s"
        assert writer.stdout.readline().strip() == "written"
        os.kill(writer.pid, signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        for stream in (writer.stdin, writer.stdout):
            if stream is not None:
                stream.close()
    # The records were in the WAL, not yet checkpointed; reopening recovers them.
    assert (tmp_path / "ledger.db-wal").stat().st_size > 0
    with Ledger(path) as ledger:
        totals = ledger.tenant_totals("team-a")
        assert totals.requests == records
        assert totals.completion_tokens == sum(range(records))
        (rows,) = ledger._db.execute("SELECT COUNT(*) FROM usage").fetchone()
        assert rows == records


# Version 1's schema, as routers before the daily totals wrote it.
V1_SCHEMA = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE usage (
        id INTEGER PRIMARY KEY, request_id TEXT NOT NULL, attempt INTEGER NOT NULL,
        time_s REAL NOT NULL, tenant TEXT NOT NULL, tier_requested TEXT NOT NULL,
        tier_served TEXT, pool TEXT, endpoint TEXT, prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL, latency_s REAL NOT NULL, ttft_s REAL,
        cost_usd REAL NOT NULL, http_status INTEGER NOT NULL, outcome TEXT NOT NULL,
        escalated INTEGER NOT NULL)""",
    "CREATE INDEX usage_tenant_time ON usage (tenant, time_s, cost_usd)",
    """CREATE TABLE tenant_totals (
        tenant TEXT NOT NULL, tier_served TEXT NOT NULL, requests INTEGER NOT NULL,
        attempts INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
        PRIMARY KEY (tenant, tier_served)) WITHOUT ROWID""",
)


def test_a_version_1_ledger_is_brought_up_to_date(tmp_path: Path) -> None:
    """Its rows become daily totals: the same totals and the same spend per day as before,
    and the index only version 1 read is gone."""
    day = utc_day(T0)
    records = [
        usage(request_id="r1", time_s=day * 86400.0 + 10, cost_usd=1.0),
        usage(request_id="r2", time_s=day * 86400.0 + 86399, cost_usd=2.0),
        usage(request_id="r3", time_s=(day + 1) * 86400.0, tier_served="premium", cost_usd=4.0),
        usage(request_id="r3", time_s=(day + 1) * 86400.0, tier_served="wafer-scale", attempt=2,
              escalated=True, cost_usd=8.0),
        usage(request_id="r4", time_s=(day + 2) * 86400.0, tier_served=None, pool=None,
              endpoint=None, prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
              http_status=429, outcome="shed"),
        usage(request_id="r5", tenant="team-b", cost_usd=16.0),
    ]  # fmt: skip
    path = tmp_path / "v1.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:
        for statement in V1_SCHEMA:
            db.execute(statement)
        db.execute("INSERT INTO schema_version VALUES (1)")
        for r in records:
            db.execute(
                "INSERT INTO usage (request_id, attempt, time_s, tenant, tier_requested,"
                " tier_served, pool, endpoint, prompt_tokens, completion_tokens, latency_s,"
                " ttft_s, cost_usd, http_status, outcome, escalated)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (r.request_id, r.attempt, r.time_s, r.tenant, r.tier_requested, r.tier_served,
                 r.pool, r.endpoint, r.prompt_tokens, r.completion_tokens, r.latency_s,
                 r.ttft_s, r.cost_usd, r.http_status, r.outcome, int(r.escalated)),
            )  # fmt: skip
        db.commit()
    with Ledger(path) as ledger:
        db = ledger._db
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(2,)]
        names = {n for (n,) in db.execute("SELECT name FROM sqlite_master")}
        assert "tenant_totals" not in names and "usage_tenant_time" not in names
        totals = ledger.tenant_totals("team-a")
        assert (totals.requests, totals.attempts) == (4, 5)
        assert (totals.prompt_tokens, totals.completion_tokens) == (4000, 800)
        assert totals.cost_usd == 15.0
        assert sorted(totals.by_tier_served) == ["batched", "premium", "wafer-scale"]
        assert totals.by_tier_served["wafer-scale"].requests == 1  # attempts served there
        assert [ledger.spend_in_days("team-a", d, d + 1) for d in (day, day + 1, day + 2)] == [
            3.0, 12.0, 0.0,
        ]  # fmt: skip
        assert ledger.tenant_totals("team-b").cost_usd == 16.0
        (rows,) = db.execute("SELECT COUNT(*) FROM usage").fetchone()
        assert rows == len(records)  # the requests themselves stay
        ledger.record(usage(request_id="r6", time_s=(day + 2) * 86400.0 + 5, cost_usd=32.0))
        assert ledger.spend_in_days("team-a", day + 2) == 32.0
    with Ledger(path) as reopened:  # migrated once
        assert reopened.tenant_totals("team-a").cost_usd == 47.0


def test_pruning_takes_the_oldest_rows_and_keeps_every_total() -> None:
    with Ledger(":memory:") as ledger:
        for n in range(10):
            ledger.record(usage(request_id=f"r{n}", time_s=T0 + 86400 * n, cost_usd=1.0))
        totals = ledger.tenant_totals("team-a")
        # Older than day 3: rows 0-2 go, and only the 2 oldest rows are looked at per call.
        assert ledger.prune(2, before_s=T0 + 86400 * 3) == 2
        assert ledger.prune(2, before_s=T0 + 86400 * 3) == 1
        assert ledger.prune(2, before_s=T0 + 86400 * 3) == 0
        assert ledger.prune(4) == 4  # by count: the next four oldest, whatever their age
        left = [r for (r,) in ledger._db.execute("SELECT request_id FROM usage ORDER BY id")]
        assert left == ["r7", "r8", "r9"]
        assert ledger.tenant_totals("team-a") == totals
        assert ledger.spend_in_days("team-a", 0) == 10.0


def test_pruned_pages_are_reused_so_the_file_stops_growing(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        for n in range(3000):
            ledger.record(usage(request_id=f"a{n}"))
        full = ledger.used_bytes()
        (pages,) = ledger._db.execute("PRAGMA page_count").fetchone()
        while ledger.prune(500):
            pass
        assert ledger.used_bytes() < full / 10
        for n in range(3000):
            ledger.record(usage(request_id=f"b{n}"))
        assert ledger._db.execute("PRAGMA page_count").fetchone() == (pages,)
        assert ledger.used_bytes() == pytest.approx(full, rel=0.1)
