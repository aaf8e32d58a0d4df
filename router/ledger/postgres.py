"""The usage ledger in PostgreSQL, shared by every router replica and worker.

Same records, daily totals and guarantee as the SQLite ledger (router/ledger/sqlite.py): a
request awaits `committed()` before its reply's end goes out, so a reply a client has whole is
on record. Records commit in groups: `add` puts a record into the next batch and one writer
task commits each batch as one transaction (rows upserted by request id and attempt, daily
totals moved by the difference, in a fixed order so replicas never deadlock).

When the database refuses writes or cannot be reached, a batch is held in memory, in order,
and written once it takes them again (tried every `interval_s`). Held records also go to the
process's spool file on local disk (router/ledger/spool.py), fsynced before `committed()`
returns, so replies are not held up by an outage and a process that dies with records held
loses none: the next process of the pod replays its file. When the spool cannot take a
record, `committed()` raises LedgerError and the reply's end does not go out; when the spool
is nearly full, `refusing` tells the router to refuse new work. Reads count what is held or
not yet committed. What the ledger does with its spool, and how the file empties again, is in
router/ledger/postgres_spooling.py.

The connection pool is made on the serving event loop, at the first use; the URL (with any
password in it) is never logged: `where` names the server and database.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
from collections import deque
from typing import Any

import asyncpg

from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.postgres_connect import (
    CONNECT_TIMEOUT_S,
    open_check,
    reason,
    where,
)
from tiergate.router.ledger.postgres_reads import PostgresReads
from tiergate.router.ledger.postgres_recovery import (
    BACKLOG_BATCH,
    NEVER_TAKEN,
    PostgresRecovery,
    write_over_held,
)
from tiergate.router.ledger.postgres_schema import WRITE_BATCH, batch_arguments, migrate
from tiergate.router.ledger.postgres_spooling import PostgresSpooling
from tiergate.router.ledger.records import (
    LedgerError,
    UsageRecord,
)
from tiergate.router.ledger.spool import LedgerSpool, Orphan

__all__ = ["PostgresLedger", "open_check", "where"]

log = logging.getLogger("tiergate.router")

#: Seconds between tries at writing held records.
INTERVAL_S = 1.0
#: How long one database call may take before its records are held (a hung server).
TIMEOUT_S = 5.0
#: Connections per router process: the writer, leases, `/v1/usage` and retention.
POOL_SIZE = 4
#: Records held in memory while the database refuses writes; beyond this, new ones are dropped.
MAX_BACKLOG = 100_000
#: Part of the spool kept for requests already in flight: past the rest, new work is refused.
SPOOL_RESERVE = 0.1
#: How long a router process's lease lasts, and how often it is renewed: a process silent for
#: longer is taken for dead, and its streams' rows left `incomplete` are closed.
LEASE_TTL_S = 30.0
#: How often a process closes the rows dead processes left `incomplete`.
SWEEP_INTERVAL_S = 15.0


class PostgresLedger(PostgresReads, PostgresRecovery, PostgresSpooling):
    """The usage ledger in the PostgreSQL database at `dsn` (a service: `start`, `stop`)."""

    def __init__(
        self,
        dsn: str,
        *,
        interval_s: float = INTERVAL_S,
        timeout_s: float = TIMEOUT_S,
        pool_size: int = POOL_SIZE,
        spool: LedgerSpool | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
    ) -> None:
        self._dsn = dsn
        self.spool = spool
        #: This process's name on its rows and its lease (host, pid, a random part).
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._lease_ttl_s, self._sweep_interval_s = lease_ttl_s, sweep_interval_s
        self._renewed_s = -math.inf  # when the lease was last renewed (monotonic)
        self._swept_s = -math.inf
        self.swept = 0  # rows of dead processes' streams this process closed
        self.where = where(dsn)
        self._interval_s, self._timeout_s, self._pool_size = interval_s, timeout_s, pool_size
        self._pool: Any = None
        self._writer_conn: Any = None
        self._pool_lock: asyncio.Lock | None = None
        self._next: dict[LedgerEntry, None] = {}  # to write in the next batch, in order
        # Each batch's waiters learn whether its records are durable (committed or spooled).
        self._next_done: asyncio.Future[bool] | None = None
        self._writing: asyncio.Future[bool] | None = None
        self._backlog: deque[LedgerEntry] = deque()
        self._spooled: set[LedgerEntry] = set()  # spooled, newest record not yet committed
        self._appending = False
        self._unwritten: dict[str, float] = {}  # tenant -> USD not yet committed
        self._committed: dict[str, float] = {}  # tenant -> USD committed since start
        self._refused_work = False  # what `refusing` said last, to log its changes once
        self._wake: asyncio.Event | None = None
        self._halt: asyncio.Event | None = None  # set by stop(): the backlog writer ends
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.max_backlog = MAX_BACKLOG
        self.dropped = 0
        self.replayed = 0  # records of spool files written to the database
        # Records a full backlog let go of, on disk only: in this process's file, and in its
        # former file (`_rotated`) that it writes from; their USD, by tenant, not yet written.
        self._let_go = 0
        self._let_go_usd: dict[str, float] = {}
        self._rotated: Orphan | None = None
        self._rotated_usd: dict[str, float] = {}
        self._rotated_records = 0

    # The service.

    def start(self) -> None:
        if self.spool is not None:
            try:
                self.spool.open()
            except OSError as exc:
                raise LedgerError(
                    f"cannot open the ledger's spool in {self.spool.folder}: {exc}"
                ) from None
        self._wake = asyncio.Event()
        self._halt = asyncio.Event()
        self._pool_lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name="ledger-writer"),
            loop.create_task(self._drain(), name="ledger-backlog-writer"),
        ]

    async def stop(self) -> None:
        """Write what is waiting (one last try at the backlog), then close the pool."""
        tasks, self._tasks = self._tasks, []
        if tasks:
            self._stopping = True  # the writers finish the write they are in, never half of one
            assert self._wake is not None and self._halt is not None
            self._wake.set()
            self._halt.set()
            await asyncio.gather(*tasks)
        await self._write_next()
        while self._backlog and await self._write_backlog():
            pass
        if not self._backlog:
            await self._write_rotated()
        if self._rotated is not None:  # the next process writes it
            rotated, self._rotated = self._rotated, None
            rotated.release()
        if self._backlog:
            unspooled = sum(e.spooled is not e.record for e in self._backlog)
            log.error(
                "event=ledger_backlog_left where=%s records=%d spooled=%d lost=%d",
                self.where, len(self._backlog), len(self._backlog) - unspooled, unspooled,
            )  # fmt: skip
        if self.spool is not None:
            # Records spooled but not committed include those a full backlog let go of
            # (`_hold`): the file stays for the next process to replay (idempotently).
            self.spool.close(keep=bool(self._backlog or self._spooled or self._let_go))
        if not self._backlog and self._pool is not None:
            try:  # a clean stop: any row of this process still `incomplete` is closed
                await self._pool.execute(
                    "DELETE FROM router_lease WHERE holder = $1", self.holder,
                    timeout=self._timeout_s,
                )  # fmt: skip
            except Exception as exc:  # the lease expires by itself
                log.warning("event=ledger_lease_failed where=%s error=%s", self.where, reason(exc))
        if self._writer_conn is not None:
            conn, self._writer_conn = self._writer_conn, None
            await conn.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    def close(self) -> None:
        """Nothing left to do once the service stopped (the SQLite ledger's close)."""

    async def connection_pool(self) -> Any:
        """The pool, made at the first use; LedgerError while the database cannot be reached."""
        if self._pool is not None:
            return self._pool
        assert self._pool_lock is not None, "start() the ledger first"
        async with self._pool_lock:
            if self._pool is None:
                try:
                    pool = await asyncpg.create_pool(
                        self._dsn,
                        # No floor: a pool keeping one would log a traceback for every
                        # failed reconnection while the server is away.
                        min_size=0,
                        max_size=self._pool_size,
                        timeout=CONNECT_TIMEOUT_S,
                        command_timeout=self._timeout_s,
                    )
                    try:
                        async with pool.acquire() as conn:
                            await migrate(conn, self.where)
                    except BaseException:
                        await pool.close()
                        raise
                except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                    raise LedgerError(f"cannot reach {self.where}: {reason(e)}") from None
                self._pool = pool
        return self._pool

    # Writing.

    async def _writer(self) -> Any:
        """The writer's own connection (no pool: returning one to a pool costs a round trip
        per batch), opened again after a failure."""
        if self._writer_conn is None or self._writer_conn.is_closed():
            await self.connection_pool()  # the schema is made or checked with the pool
            try:
                self._writer_conn = await asyncio.wait_for(
                    asyncpg.connect(self._dsn, timeout=CONNECT_TIMEOUT_S), CONNECT_TIMEOUT_S
                )
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise LedgerError(f"cannot reach {self.where}: {reason(exc)}") from None
        return self._writer_conn

    def _drop_writer(self) -> None:
        """Forget the writer's connection after a failed write (it may be broken, or inside a
        statement a timeout cut short): the next write opens a new one."""
        conn, self._writer_conn = self._writer_conn, None
        if conn is not None:
            conn.terminate()

    def add(self, usage: UsageRecord) -> LedgerEntry:
        """Record one attempt in the next batch; `await committed()` before the client learns
        of it. The entry is the attempt's row, for `amend`."""
        entry = LedgerEntry(usage)
        self._count(usage, None)
        self._queue(entry)
        return entry

    def amend(self, entry: LedgerEntry, usage: UsageRecord) -> None:
        """Make an attempt's row say `usage` instead; its daily totals move by the difference.
        A held entry is queued too: its new record must reach the spool before `committed()`."""
        self._count(usage, entry.record)
        entry.record = usage
        self._queue(entry)

    def _count(self, usage: UsageRecord, before: UsageRecord | None) -> None:
        grew = usage.cost_usd - (before.cost_usd if before is not None else 0.0)
        if grew:
            self._unwritten[usage.tenant] = self._unwritten.get(usage.tenant, 0.0) + grew

    def _queue(self, entry: LedgerEntry) -> None:
        self._next[entry] = None
        if self._wake is not None:
            self._wake.set()

    def unwritten_usd(self, tenant: str) -> float:
        """USD of `tenant`'s records not yet committed (waiting, being written, or held)."""
        return self._unwritten.get(tenant, 0.0)

    def committed_usd(self, tenant: str) -> float:
        """USD of `tenant`'s records this ledger committed since it started."""
        return self._committed.get(tenant, 0.0)

    async def committed(self) -> None:
        """Return once every record added so far is committed or spooled; LedgerError when
        some could be neither (held in memory only)."""
        if self._next:
            if self._next_done is None:
                self._next_done = asyncio.get_running_loop().create_future()
            durable = await asyncio.shield(self._next_done)
        elif self._writing is not None:
            durable = await asyncio.shield(self._writing)
        else:
            return
        if not durable:
            raise LedgerError(f"{self.where} cannot be written and the spool is full")

    @property
    def refusing(self) -> bool:
        """Whether new work should be refused: the spool holds records and is nearly full,
        so a request served now might find no durable place for its record."""
        spool = self.spool
        now = spool is not None and spool.bytes >= spool.max_bytes * (1 - SPOOL_RESERVE)
        if now != self._refused_work:
            self._refused_work = now
            held = spool.bytes if spool is not None else 0
            if now:
                log.warning(
                    "event=ledger_refusing_new_work where=%s spool_bytes=%d", self.where, held
                )
            else:
                log.warning("event=ledger_accepting_new_work where=%s", self.where)
        return now

    @property
    def backlog(self) -> int:
        """Records held in memory, not yet written."""
        return len(self._backlog)

    @property
    def on_disk_only(self) -> int:
        """Records a full backlog let go of that are not yet written: in the spool only."""
        return self._let_go + self._rotated_records

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._write_next()
            except Exception:  # a bug: the writer must outlive it, or every reply would wait
                log.exception("event=ledger_writer_failed where=%s", self.where)

    async def _drain(self) -> None:
        """The backlog writer: every `interval_s`, write held records, oldest first, then
        replay dead processes' spool files. A task of its own, so that while it waits on the
        database new batches are still spooled and their replies go out."""
        assert self._halt is not None
        await self._keep_lease()  # before this process's first rows are looked at
        while not self._stopping:
            try:
                await asyncio.wait_for(self._halt.wait(), self._interval_s)
            except TimeoutError:
                pass
            try:
                while self._backlog and not self._stopping and await self._write_backlog():
                    await asyncio.sleep(0)
                if not self._backlog and not self._stopping:
                    await self._keep_lease()
                    await self._write_rotated()
                    await self._replay_orphans()
            except Exception:  # a bug: log it, and try again next round
                log.exception("event=ledger_backlog_writer_failed where=%s", self.where)

    async def _write_next(self) -> None:
        """Write the waiting batch as one transaction, or spool and hold it: behind records
        already held it is not tried (they go first, in order)."""
        if not self._next:
            return
        batch = [(entry, entry.record) for entry in self._next]
        self._next.clear()
        done = self._writing = self._next_done or asyncio.get_running_loop().create_future()
        self._next_done = None
        durable = True
        try:
            if self._backlog or self._beside_rotated(batch) or not await self._try_write(batch):
                durable = await self._spool(batch)
                for entry, record in batch:
                    self._hold(entry, record)
            else:
                self._clear_spool()
        finally:
            self._writing = None
            if not done.done():
                done.set_result(durable)

    async def _write_backlog(self) -> int:
        """Write up to `BACKLOG_BATCH` held records, oldest first; how many left the backlog.
        A held record's earlier write failed, but may have committed all the same (the
        connection lost after COMMIT, a timeout while a standby confirmed it): each is written
        over the row the database holds (`write_over_held`), so the daily totals move once."""
        batch = [(e, e.record) for e in list(self._backlog)[:BACKLOG_BATCH]]
        if not await self._try_write(batch, pooled=True):
            return 0
        for _, record in batch:
            entry = self._backlog.popleft()
            entry.held = False
            if entry.record is not record:  # amended while its older record was written
                self._queue(entry)
        if not self._backlog:
            log.warning("event=ledger_backlog_written where=%s", self.where)
        self._clear_spool()
        return len(batch)

    async def _try_write(
        self, batch: list[tuple[LedgerEntry, UsageRecord]], *, pooled: bool = False
    ) -> bool:
        """Commit `batch` (on the batch writer's connection, or one of the pool's, over the
        rows held); False (logged) when the database refused or could not be reached. A
        record it can never take is dropped and counted, and the rest written."""
        pooled = pooled or any(entry.over_held for entry, _ in batch)
        try:
            await self._write(batch, pooled=pooled)
        except NEVER_TAKEN:
            if len(batch) > 1:
                for one in batch:
                    if not await self._try_write([one], pooled=pooled):
                        return False
                return True
            entry, record = batch[0]
            self.dropped += 1
            log.error("event=ledger_record_dropped where=%s", self.where)
            self._written(entry, record)
            return True
        except Exception as exc:  # the server or the connection, in any of asyncpg's words
            # (a server shutting down mid-statement can surface as InternalClientError)
            log.warning(
                "event=ledger_write_failed where=%s error=%s holding=in_memory records=%d",
                self.where, reason(exc), len(batch),
            )  # fmt: skip
            return False
        for entry, record in batch:
            self._written(entry, record)
        return True

    def _written(self, entry: LedgerEntry, record: UsageRecord) -> None:
        """`record` (what `entry` said when its batch was taken) is committed."""
        before = entry.written
        entry.written = record
        entry.rowid = 0  # has a row
        entry.over_held = False  # what it holds is known: `record`, or newer
        if record is entry.record or record is entry.spooled:
            self._spooled.discard(entry)
        grew = record.cost_usd - (before.cost_usd if before is not None else 0.0)
        if grew:
            self._settle(record.tenant, grew)

    def _count_written(self, record: UsageRecord, before: UsageRecord | None) -> None:
        grew = record.cost_usd - (before.cost_usd if before is not None else 0.0)
        if grew:
            self._settle(record.tenant, grew, committed=False)

    def _settle(self, tenant: str, usd: float, *, committed: bool = True) -> None:
        """`usd` of `tenant`'s is no longer waiting to be written: committed, or lost."""
        left = self._unwritten.get(tenant, 0.0) - usd
        if abs(left) < 1e-12:
            self._unwritten.pop(tenant, None)
        else:
            self._unwritten[tenant] = left
        if committed:
            self._committed[tenant] = self._committed.get(tenant, 0.0) + usd

    async def _write(self, batch: list[tuple[LedgerEntry, UsageRecord]], *, pooled: bool) -> None:
        if pooled:  # the backlog's records (`_write_backlog`)
            pool = await self.connection_pool()
            async with pool.acquire() as conn, conn.transaction():
                records = [record for _, record in batch]
                await write_over_held(conn, records, self.holder, self._timeout_s)
            return
        arguments = batch_arguments(batch, self.holder)
        conn = await self._writer()
        try:
            async with asyncio.timeout(self._timeout_s):
                await conn.fetchrow(WRITE_BATCH, *arguments)
        except NEVER_TAKEN:
            raise  # the connection is fine: the record is not
        except BaseException:
            self._drop_writer()
            raise

    def _not_written(self) -> list[LedgerEntry]:
        # An amended held entry is waiting in both: count it once.
        return list(dict.fromkeys([*self._next, *self._backlog]))
