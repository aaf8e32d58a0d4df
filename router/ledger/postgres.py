"""The usage ledger in PostgreSQL, shared by every router replica and worker.

Same records, daily totals and guarantee as the SQLite ledger (router/ledger/sqlite.py): a
request awaits `committed()` before its reply's end goes out, so a reply a client has whole is
on record. Records commit in groups: `add` puts a record into the next batch and one writer
task commits each batch as one transaction (rows upserted by request id and attempt, daily
totals moved by the difference, in a fixed order so replicas never deadlock).

When the database refuses writes or cannot be reached, a batch is held in memory, in order,
and written once it takes them again (tried every `interval_s`); `committed()` returns for held
records, so replies are not held up by an outage. Held records are not durable, and past
`max_backlog` new ones are dropped and counted. Reads count what is held or not yet committed.

The connection pool is made on the serving event loop, at the first use; the URL (with any
password in it) is never logged: `where` names the server and database.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, cast

import asyncpg

from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.postgres_connect import (
    CONNECT_TIMEOUT_S,
    open_check,
    reason,
    where,
)
from tiergate.router.ledger.postgres_reads import PostgresReads
from tiergate.router.ledger.postgres_schema import WRITE_BATCH, migrate
from tiergate.router.ledger.records import (
    LedgerError,
    UsageRecord,
)
from tiergate.router.ledger.sqlite_schema import totals_delta

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
#: Held records written per transaction once the database is back.
BACKLOG_BATCH = 500

#: Errors of a record the database can never take: it is dropped, not held.
_NEVER = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)


class PostgresLedger(PostgresReads):
    """The usage ledger in the PostgreSQL database at `dsn` (a service: `start`, `stop`)."""

    def __init__(
        self,
        dsn: str,
        *,
        interval_s: float = INTERVAL_S,
        timeout_s: float = TIMEOUT_S,
        pool_size: int = POOL_SIZE,
    ) -> None:
        self._dsn = dsn
        self.where = where(dsn)
        self._interval_s, self._timeout_s, self._pool_size = interval_s, timeout_s, pool_size
        self._pool: Any = None
        self._writer_conn: Any = None
        self._pool_lock: asyncio.Lock | None = None
        self._next: dict[LedgerEntry, None] = {}  # to write in the next batch, in order
        self._next_done: asyncio.Future[None] | None = None
        self._writing: asyncio.Future[None] | None = None
        self._backlog: deque[LedgerEntry] = deque()
        self._unwritten: dict[str, float] = {}  # tenant -> USD not yet committed
        self._committed: dict[str, float] = {}  # tenant -> USD committed since start
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.max_backlog = MAX_BACKLOG
        self.dropped = 0

    # The service.

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._pool_lock = asyncio.Lock()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ledger-writer")

    async def stop(self) -> None:
        """Write what is waiting (one last try at the backlog), then close the pool."""
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True  # the writer finishes the write it is in, never half of one
            assert self._wake is not None
            self._wake.set()
            await task
        await self._write_next()
        while self._backlog and await self._write_backlog():
            pass
        if self._backlog:
            log.error(
                "event=ledger_backlog_lost where=%s records=%d", self.where, len(self._backlog)
            )
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
        """Make an attempt's row say `usage` instead; its daily totals move by the difference."""
        self._count(usage, entry.record)
        entry.record = usage
        if not entry.held:
            self._queue(entry)

    def _count(self, usage: UsageRecord, before: UsageRecord | None) -> None:
        grew = usage.cost_usd - (before.cost_usd if before is not None else 0.0)
        if grew:
            self._unwritten[usage.tenant] = self._unwritten.get(usage.tenant, 0.0) + grew

    def _queue(self, entry: LedgerEntry) -> None:
        if self._backlog:
            self._hold(entry)  # in order behind what is held
            return
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
        """Return once every record added so far is committed (or held in the backlog)."""
        if self._next:
            if self._next_done is None:
                self._next_done = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._next_done)
        elif self._writing is not None:
            await asyncio.shield(self._writing)

    @property
    def backlog(self) -> int:
        """Records held in memory, not yet written."""
        return len(self._backlog)

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
                while self._backlog and not self._stopping and await self._write_backlog():
                    await asyncio.sleep(0)
            except Exception:  # a bug: the writer must outlive it, or every reply would wait
                log.exception("event=ledger_writer_failed where=%s", self.where)

    async def _write_next(self) -> None:
        """Write the waiting batch as one transaction, or hold it."""
        if not self._next:
            return
        batch = [(entry, entry.record) for entry in self._next]
        self._next.clear()
        done = self._writing = self._next_done or asyncio.get_running_loop().create_future()
        self._next_done = None
        try:
            if not await self._try_write(batch):
                for entry, _ in batch:
                    self._hold(entry)
        finally:
            self._writing = None
            if not done.done():
                done.set_result(None)

    async def _write_backlog(self) -> int:
        """Write up to `BACKLOG_BATCH` held records, oldest first; how many left the backlog."""
        batch = [(e, e.record) for e in list(self._backlog)[:BACKLOG_BATCH]]
        if not await self._try_write(batch):
            return 0
        for _ in batch:
            self._backlog.popleft().held = False
        if not self._backlog:
            log.warning("event=ledger_backlog_written where=%s", self.where)
        return len(batch)

    async def _try_write(self, batch: list[tuple[LedgerEntry, UsageRecord]]) -> bool:
        """Commit `batch`; False (logged) when the database refused or could not be reached. A
        record it can never take is dropped and counted, and the rest written."""
        try:
            await self._write(batch)
        except _NEVER:
            if len(batch) > 1:
                for one in batch:
                    if not await self._try_write([one]):
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
        self._count_written(record, before)
        grew = record.cost_usd - (before.cost_usd if before is not None else 0.0)
        if grew:
            self._committed[record.tenant] = self._committed.get(record.tenant, 0.0) + grew

    def _count_written(self, record: UsageRecord, before: UsageRecord | None) -> None:
        grew = record.cost_usd - (before.cost_usd if before is not None else 0.0)
        if grew:
            left = self._unwritten.get(record.tenant, 0.0) - grew
            if abs(left) < 1e-12:
                self._unwritten.pop(record.tenant, None)
            else:
                self._unwritten[record.tenant] = left

    async def _write(self, batch: list[tuple[LedgerEntry, UsageRecord]]) -> None:
        rows = [_row(record) for _, record in batch]
        totals: dict[tuple[str, int, str], list[float]] = {}
        for entry, record in batch:
            tenant, day, tier, *add = totals_delta(record, entry.written)
            key = (str(tenant), cast(int, day), str(tier))
            sums = totals.setdefault(key, [0, 0, 0, 0, 0.0])
            for i, value in enumerate(add):
                sums[i] += cast(float, value)
        daily = [(*key, *(int(v) for v in sums[:4]), float(sums[4]))
                 for key, sums in sorted(totals.items())]  # fmt: skip
        columns = [list(column) for column in zip(*rows, strict=True)]
        sums_by_column = [list(column) for column in zip(*daily, strict=True)]
        conn = await self._writer()
        try:
            async with asyncio.timeout(self._timeout_s):
                await conn.fetchrow(WRITE_BATCH, *columns, *sums_by_column)
        except _NEVER:
            raise  # the connection is fine: the record is not
        except BaseException:
            self._drop_writer()
            raise

    def _not_written(self) -> list[LedgerEntry]:
        return [*self._next, *self._backlog]

    def _hold(self, entry: LedgerEntry) -> None:
        if entry.held:
            return
        if len(self._backlog) >= self.max_backlog:
            self.dropped += 1
            self._count_written(entry.record, entry.written)  # never to be written
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.error("event=ledger_backlog_full where=%s dropped=%d", self.where, self.dropped)
            return
        entry.held = True
        self._backlog.append(entry)


def _row(u: UsageRecord) -> tuple[object, ...]:
    return (
        u.request_id, u.attempt, u.time_s, u.tenant, u.tier_requested, u.tier_served, u.pool,
        u.endpoint, u.prompt_tokens, u.completion_tokens, u.latency_s, u.ttft_s, u.cost_usd,
        u.http_status, u.outcome, u.escalated,
    )  # fmt: skip
