"""The usage ledger: one durable row per request attempt, in SQLite.

Every request the router answers is recorded with its tenant, the tier asked for and the tier
that served it, pool, endpoint, tokens, latency and cost at the *served* tier's price. A cascade
bills both attempts: two rows share a `request_id`, with `attempt` 1 and 2. A stream's row is
written at its first token and amended as it goes (`amend`), outcome `incomplete` until it ends.

Durability: WAL mode with `synchronous=NORMAL`, so a committed record survives SIGKILL (it is
in the page cache), not a power loss. Records commit in groups: `add` puts a record into the
open transaction and the event loop commits everything added in that round at once; a request
awaits `committed()` before its reply's end goes out, so a reply a client has whole is on
record.

Checkpoints run on a thread of their own (router/ledger/checkpoint.py), never inside a record: a
PASSIVE pass every interval, then a RESTART pass once the WAL is long, because under steady load
passive passes alone never let the WAL start over and it grew until the disk filled. A WAL that
grew while checkpoints could not finish is cut back once they can.

Per-tenant totals per UTC day and tier served live in a second table, written in the same
transaction as each row: bills, budgets and `/v1/usage` read them, so request rows can be
pruned (router/ledger/retention.py) without changing any of them.

When the database refuses writes (locked, full, read-only), records wait in memory, in order,
and are written once it takes them (`flush_backlog`, router/ledger/backlog.py); totals and
budget spend count them meanwhile. Held records are not durable, and past `MAX_BACKLOG` new
ones are dropped and counted.

Threading: records and reads use one connection, on the event loop's thread; the checkpoint
thread has its own connection and only ever checkpoints.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from pathlib import Path

from tiergate.router.ledger.checkpoint import Checkpointer
from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.records import (
    LedgerError,
    Outcome,
    TierTotals,
    UsageRecord,
    UsageTotals,
    utc_day,
)
from tiergate.router.ledger.sqlite_reads import SqliteReads
from tiergate.router.ledger.sqlite_schema import (
    ADD_TOTALS,
    DELETE,
    INSERT,
    SCHEMA_VERSION,
    UPDATE,
    migrate,
    row_values,
    totals_delta,
)

__all__ = [
    "SCHEMA_VERSION",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "Outcome",
    "TierTotals",
    "UsageRecord",
    "UsageTotals",
    "utc_day",
]

log = logging.getLogger("tiergate.router")


#: How often the checkpoint thread folds the WAL into the database file.
CHECKPOINT_INTERVAL_S = 1.0
#: WAL frames (pages) from which the checkpoint thread restarts the WAL (SQLite's own automatic
#: checkpoint starts at 1000 too).
RESTART_FRAMES = 1000
#: When the WAL starts over, SQLite cuts a longer file back to this (`journal_size_limit`). It
#: is above what a busy router writes in one interval, because that cut is an ftruncate in the
#: writer, on the event loop (benchmarks/ledger_record.py's max per record shows its cost).
WAL_SIZE_LIMIT = 64 * 1024 * 1024
#: A WAL file longer than this, and than twice what the WAL holds now, is cut to nothing once
#: all of it is copied: a file that grew in an episode (a disk full, a long reader) would
#: otherwise keep its size below `WAL_SIZE_LIMIT` for good, filling a small volume.
WAL_KEEP_BYTES = 4 * 1024 * 1024
#: Page size of a new ledger file; an existing one keeps its own.
PAGE_SIZE = 1024
#: How long a record waits for the write lock (SQLite's busy handler, on the event loop). The
#: checkpoint thread's RESTART pass holds it for a few ms; a record that still finds it taken
#: joins the backlog and is written a second later.
BUSY_TIMEOUT_S = 0.1
#: How long opening the ledger waits for the lock (another router creating the schema).
OPEN_TIMEOUT_S = 5.0
#: Records held in memory while the database refuses writes (~300 bytes each); beyond this many,
#: new records are dropped and counted.
MAX_BACKLOG = 100_000


#: An entry written in the open batch, with its `rowid` and `written` from before (restored
#: when the batch is rolled back).
_Write = tuple[LedgerEntry, int | None, UsageRecord | None]


class Ledger(SqliteReads):
    """The usage ledger at `path` (a file, or ":memory:" for tests)."""

    def __init__(
        self,
        path: str | Path,
        *,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
        restart_frames: int = RESTART_FRAMES,
        wal_size_limit: int = WAL_SIZE_LIMIT,
        wal_keep_bytes: int = WAL_KEEP_BYTES,
    ) -> None:
        self.path = str(path)
        try:
            # Autocommit mode: transactions are explicit, one per record.
            # Built on one thread (the CLI's), used on the event loop's, one at a time: the
            # connection may change threads, it is never shared by two at once.
            # Opening (the schema, a migration) may wait longer for the lock than a record.
            self._db = sqlite3.connect(
                self.path, isolation_level=None, timeout=OPEN_TIMEOUT_S, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open the usage ledger {self.path}: {exc}") from exc
        try:
            # Before anything is written: SQLite ignores it once the file has pages.
            self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA wal_autocheckpoint=0")  # the checkpoint thread's job
            self._db.execute(f"PRAGMA journal_size_limit={int(wal_size_limit)}")
            migrate(self._db, self.path)
            self._db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        except sqlite3.Error as exc:
            self._db.close()
            raise LedgerError(f"cannot open the usage ledger {self.path}: {exc}") from exc
        except BaseException:
            self._db.close()
            raise
        self._checkpointer = (
            None
            if self.path == ":memory:"
            else Checkpointer(self.path, checkpoint_interval_s, restart_frames, wal_keep_bytes)
        )
        self._backlog: deque[LedgerEntry] = deque()
        self._batch: list[_Write] = []  # written in the open transaction, not committed
        self._batches_opened = 0
        self._batches_closed = 0  # committed, or refused and held
        self.max_backlog = MAX_BACKLOG
        self.dropped = 0  # records lost: over `max_backlog`, or that the database refused

    def close(self) -> None:
        """Close the database, after committing the open batch and a last try at writing the
        backlog."""
        self.commit_batch()
        while self._backlog and self.flush_backlog(1000):
            pass
        if self._backlog:
            log.error("event=ledger_backlog_lost path=%s records=%d", self.path, len(self._backlog))
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def record(self, usage: UsageRecord) -> LedgerEntry:
        """Durably record one attempt (see the module docstring for what durable means), or
        hold it in the backlog while the database refuses writes. Raises LedgerError only for
        a record the database can never take (a bug), which is counted as dropped."""
        entry = LedgerEntry(usage)
        self._record(entry)
        return entry

    def _record(self, entry: LedgerEntry) -> None:
        self.commit_batch()  # in order
        if self._backlog:
            self._hold(entry)  # in order, and without another wait for the lock
            return
        try:
            self._write(entry)
        except sqlite3.OperationalError as exc:  # locked, full, read-only, I/O: it may pass
            log.warning(
                "event=ledger_write_failed path=%s error=%s holding=in_memory", self.path, exc
            )
            self._hold(entry)
        except Exception as exc:  # sqlite3's, or a value it cannot bind (an int of 2**63)
            self.dropped += 1
            raise LedgerError(f"cannot record usage in {self.path}: {exc}") from exc

    def add(self, usage: UsageRecord) -> LedgerEntry:
        """Record one attempt in the open batch, which the event loop commits as one
        transaction once the callbacks already due have run (group commit); `await committed()`
        before the client learns of the attempt. Outside an event loop, this is `record`.

        Held in the backlog like `record`'s while the database refuses writes; a batch whose
        commit fails is held whole. Raises LedgerError for a record the database can never take
        (a bug): it is counted as dropped, and the rest of the batch stands. The entry returned
        is the attempt's row, for `amend`."""
        entry = LedgerEntry(usage)
        self._add(entry)
        return entry

    def amend(self, entry: LedgerEntry, usage: UsageRecord) -> None:
        """Make an attempt's row (from `add` or `record`) say `usage` instead, in the open batch
        as `add` does: its daily totals move by the difference. A stream's row is written at its
        first token and amended as it goes, so a router killed mid-stream has billed what it
        relayed until its last amendment."""
        entry.record = usage
        if entry.held:
            return  # the backlog writes what the entry says when it writes it
        self._add(entry)

    def _add(self, entry: LedgerEntry) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._record(entry)
            return
        if self._backlog:
            self._hold(entry)
            return
        db = self._db
        if not self._open:
            try:
                db.execute("BEGIN")
            except sqlite3.OperationalError as exc:
                self._refused(exc, [(entry, entry.rowid, entry.written)])
                return
            self._batches_opened += 1
            loop.call_soon(self.commit_batch)
        before = (entry, entry.rowid, entry.written)
        try:
            self._insert(entry)
        except sqlite3.OperationalError as exc:  # locked, full, read-only, I/O: it may pass
            self._refused(exc, [*self._batch, before])
            return
        except Exception as exc:  # a record the database can never take (a bug): it alone goes
            self.dropped += 1
            raise LedgerError(f"cannot record usage in {self.path}: {exc}") from exc
        self._batch.append(before)

    @property
    def _open(self) -> bool:
        """Whether a batch's transaction is open (possibly with no record left in it)."""
        return self._batches_closed < self._batches_opened

    async def committed(self) -> None:
        """Return once every record added so far is committed (or held in the backlog)."""
        opened = self._batches_opened
        while self._batches_closed < opened:
            await asyncio.sleep(0)  # call_soon callbacks run in order: the commit runs first

    def commit_batch(self) -> None:
        """Commit the open batch now, if there is one (also scheduled by `add`)."""
        if not self._open:
            return
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._refused(exc, self._batch)
            return
        self._batch_closed()

    def _batch_closed(self) -> None:
        self._batch = []
        self._batches_closed = self._batches_opened

    def _refused(self, exc: sqlite3.Error, writes: list[_Write]) -> None:
        """The database refused a batch: it is rolled back, its entries say again what the
        database holds, and they are held, in order."""
        self._rollback()
        self._batch_closed()
        for entry, rowid, written in reversed(writes):
            entry.rowid, entry.written = rowid, written
        entries = list(dict.fromkeys(entry for entry, _, _ in writes))
        log.warning(
            "event=ledger_write_failed path=%s error=%s holding=in_memory records=%d",
            self.path, exc, len(entries),
        )  # fmt: skip
        for entry in entries:
            self._hold(entry)

    @property
    def backlog(self) -> int:
        """Records held in memory, not yet written."""
        return len(self._backlog)

    @property
    def refusing(self) -> bool:
        """Never: one process's ledger holds what its file refuses in memory."""
        return False

    def flush_backlog(self, limit: int) -> int:
        """Write up to `limit` held records, oldest first, without waiting for the write lock.
        Returns how many left the backlog (0 while the database still refuses)."""
        self.commit_batch()
        done = 0
        db = self._db
        db.execute("PRAGMA busy_timeout=0")  # retried next round: never hold the loop waiting
        try:
            while self._backlog and done < limit:
                entry = self._backlog[0]
                try:
                    self._write(entry)
                except sqlite3.OperationalError:
                    break
                except Exception as exc:  # never takeable: it would block the backlog for ever
                    self.dropped += 1
                    log.error("event=ledger_record_dropped path=%s error=%s", self.path, exc)
                self._backlog.popleft()
                entry.held = False
                done += 1
        finally:
            db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        if done and not self._backlog:
            log.warning("event=ledger_backlog_written path=%s", self.path)
        return done

    def _hold(self, entry: LedgerEntry) -> None:
        if entry.held:
            return  # held already: written as it says then
        if len(self._backlog) >= self.max_backlog:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.error("event=ledger_backlog_full path=%s dropped=%d", self.path, self.dropped)
            return
        entry.held = True
        self._backlog.append(entry)

    def _write(self, entry: LedgerEntry) -> None:
        """One entry's row and its daily totals, in one committed transaction."""
        db = self._db
        rowid, written = entry.rowid, entry.written
        try:
            db.execute("BEGIN")
            self._insert(entry)
            db.execute("COMMIT")
        except BaseException:
            self._rollback()
            entry.rowid, entry.written = rowid, written
            raise

    def _insert(self, entry: LedgerEntry) -> None:
        """An entry's row (inserted, or updated to what it says now) and the difference to its
        daily totals, in the open transaction: both or neither (each statement is atomic; a row
        whose totals fail is put back as it was, which costs nothing when they do not, unlike a
        savepoint per record)."""
        db = self._db
        usage, written = entry.record, entry.written
        if entry.rowid is None:
            rowid = db.execute(INSERT, row_values(usage)).lastrowid
            undo: tuple[str, tuple[object, ...]] = (DELETE, (rowid,))
            totals = totals_delta(usage, None)
        else:
            rowid = entry.rowid
            db.execute(UPDATE, (*row_values(usage), rowid))
            assert written is not None
            undo = (UPDATE, (*row_values(written), rowid))
            totals = totals_delta(usage, written)
        try:
            db.execute(ADD_TOTALS, totals)
        except BaseException:
            db.execute(*undo)
            raise
        entry.rowid, entry.written = rowid, usage

    def _rollback(self) -> None:
        # SQLite has already rolled back after some errors (e.g. a full disk), and a connection
        # used from the wrong thread refuses even this; the original error is the one to raise.
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
