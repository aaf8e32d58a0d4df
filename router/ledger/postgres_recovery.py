"""What the PostgreSQL ledger does to recover from dead router processes, as methods of the
ledger (router/ledger/postgres.py): it replays their spool files (router/ledger/spool.py),
keeps this process's lease, and closes the streams' rows a dead process left `incomplete`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg

from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.postgres_connect import reason
from tiergate.router.ledger.postgres_schema import (
    RENEW_LEASE,
    SELECT_FOR_REPLAY,
    SWEEP,
    WRITE_BATCH,
    batch_arguments,
)
from tiergate.router.ledger.records import UsageRecord
from tiergate.router.ledger.spool import LedgerSpool, Orphan, latest

__all__ = ["BACKLOG_BATCH", "LEASE_RENEW_S", "NEVER_TAKEN", "PostgresRecovery", "write_over_held"]

log = logging.getLogger("tiergate.router")

#: Records written per transaction when held records or a spool file are written.
BACKLOG_BATCH = 500
#: How often a router process renews its lease (see postgres.py's LEASE_TTL_S).
LEASE_RENEW_S = 5.0


#: Errors of a record the database can never take: it is dropped, not held.
NEVER_TAKEN = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)


class PostgresRecovery:
    """Replaying dead processes' spools, the lease and the sweep (mixed into the ledger)."""

    where: str
    holder: str
    spool: LedgerSpool | None
    replayed: int
    dropped: int
    swept: int
    _timeout_s: float
    _lease_ttl_s: float
    _sweep_interval_s: float
    _renewed_s: float
    _swept_s: float

    async def connection_pool(self) -> Any:
        raise NotImplementedError

    async def _keep_lease(self) -> None:
        """Renew this process's lease when due, and close dead processes' streams' rows when
        due; a database that cannot be reached is tried again next round."""
        now = time.monotonic()
        try:
            if now - self._renewed_s >= min(LEASE_RENEW_S, self._lease_ttl_s / 3):
                pool = await self.connection_pool()
                await pool.execute(
                    RENEW_LEASE, self.holder, self._lease_ttl_s, timeout=self._timeout_s
                )
                self._renewed_s = now
            if now - self._swept_s >= self._sweep_interval_s:
                pool = await self.connection_pool()
                closed = int(await pool.fetchval(SWEEP, timeout=self._timeout_s))
                self._swept_s = now
                if closed:
                    self.swept += closed
                    log.warning(
                        "event=ledger_rows_interrupted where=%s rows=%d", self.where, closed
                    )
        except Exception as exc:  # the server or the connection, in any of asyncpg's words
            log.warning("event=ledger_lease_failed where=%s error=%s", self.where, reason(exc))

    async def _replay_orphans(self) -> None:
        """Write the records in dead processes' spool files, idempotently, and delete them."""
        if self.spool is None:
            return
        for orphan in self.spool.orphans():
            try:
                written = await self._replay(orphan)
            except Exception as exc:  # the database is away again: the file stays
                orphan.release()
                log.warning(
                    "event=ledger_replay_failed where=%s path=%s error=%s",
                    self.where, orphan.path, reason(exc),
                )  # fmt: skip
                return
            orphan.done()
            self.replayed += written
            log.warning(
                "event=ledger_spool_replayed where=%s path=%s records=%d written=%d unreadable=%d",
                self.where, orphan.path, len(orphan.records), written, orphan.unreadable,
            )  # fmt: skip

    async def _replay(self, orphan: Orphan, holder: str | None = None) -> int:
        """Upsert the newest record of each attempt in `orphan` where the database holds an
        older one or none, totals moved by the difference from what it holds; how many. A
        record the database can never take is dropped and counted, as a live write's is:
        kept, it would hold this file, and every file after it, back for ever. `holder`: the
        rows' (this process's, for its own file: its streams may still be going)."""
        records = latest(orphan.records)
        pool = await self.connection_pool()
        # A dead process's file: named after it, no lease, so a row it leaves `incomplete`
        # is closed.
        holder = holder or f"spool:{orphan.path.name}"
        written = 0
        for start in range(0, len(records), BACKLOG_BATCH):
            chunk = records[start : start + BACKLOG_BATCH]
            try:
                async with pool.acquire() as conn, conn.transaction():
                    written += await write_over_held(conn, chunk, holder, self._timeout_s)
                continue
            except NEVER_TAKEN:
                pass
            for record in chunk:  # one at a time: only the record the database refuses goes
                try:
                    async with pool.acquire() as conn, conn.transaction():
                        written += await write_over_held(conn, [record], holder, self._timeout_s)
                except NEVER_TAKEN:
                    self.dropped += 1
                    log.error("event=ledger_record_dropped where=%s path=%s",
                              self.where, orphan.path)  # fmt: skip
        return written


async def write_over_held(
    conn: Any, records: list[UsageRecord], holder: str, timeout_s: float
) -> int:
    """In the caller's transaction: upsert each record where the database holds an older one of
    its attempt (a shorter latency) or none, the daily totals moved by the difference from the
    row it holds, read under a lock. Written again, a record moves nothing: what a replay, and
    a write retried after one that committed unseen, rely on. How many it wrote."""
    rows = await conn.fetch(
        SELECT_FOR_REPLAY,
        [r.request_id for r in records],
        [r.attempt for r in records],
        timeout=timeout_s,
    )
    held = {(r.request_id, r.attempt): r for r in (UsageRecord(*row) for row in rows)}
    batch = []
    for record in records:
        before = held.get((record.request_id, record.attempt))
        if before is None or before.latency_s < record.latency_s:
            batch.append((LedgerEntry(record, written=before), record))
    if batch:
        await conn.fetchrow(WRITE_BATCH, *batch_arguments(batch, holder), timeout=timeout_s)
    return len(batch)
