"""The usage ledger: what it records, its totals, its schema, and durability under SIGKILL."""

import dataclasses
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tiergate.router.ledger import SCHEMA_VERSION, Ledger, LedgerError, UsageRecord

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


def test_spend_since_and_until() -> None:
    with Ledger(":memory:") as ledger:
        for hour in range(5):
            ledger.record(usage(request_id=f"r{hour}", time_s=T0 + 3600 * hour, cost_usd=1.0))
        ledger.record(usage(tenant="team-b", cost_usd=100.0))
        assert ledger.spend_since("team-a", T0 + 3600) == 4.0
        assert ledger.spend_since("team-a", T0 + 3600, T0 + 3 * 3600) == 2.0
        assert ledger.spend_since("team-a", T0 + 10 * 3600) == 0.0


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


def test_checkpoints_run_off_the_recording_connection(tmp_path: Path) -> None:
    """`record` never runs a checkpoint (a 3-7 ms stall of the event loop): with SQLite's
    automatic checkpoints off, what it commits stays in the WAL until the thread folds it."""
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        assert ledger._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        assert ledger._checkpointer is not None
        ledger._checkpointer.stop()  # nothing but `record` may touch the file from here
        for n in range(3000):  # ~2 WAL pages each: past SQLite's default 1000-page trigger
            ledger.record(usage(request_id=f"r{n}"))
        wal_bytes = (tmp_path / "ledger.db-wal").stat().st_size
        # Checkpointed every 1000 pages, the WAL would be reused and stay near 4 MB.
        assert wal_bytes > 8 * 1024 * 1024, "a record ran a checkpoint"
    with Ledger(path) as reopened:
        assert reopened.tenant_totals("team-a").requests == 3000


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
    with pytest.raises(LedgerError, match="schema version 2"):
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
from tiergate.router.ledger import Ledger, UsageRecord

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
