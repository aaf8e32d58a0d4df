"""The PostgreSQL ledger's spool, as methods of the ledger (router/ledger/postgres.py): what
it does with a batch it could not write, and how the spool file empties again.

A batch the database did not take is appended to the process's spool file (fsynced) and held
in memory, in order, for the backlog writer. Once every record the file holds is committed,
the file is emptied. With memory's backlog full, a spooled record is let go of: it stays on
disk only, and once the backlog is written the process starts a new file and writes the old
one from disk (`_rotate`, `_write_rotated`), as it replays a dead process's file. A record that
can be neither held nor spooled is dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.postgres_connect import reason
from tiergate.router.ledger.records import UsageRecord
from tiergate.router.ledger.spool import LedgerSpool, Orphan

__all__ = ["PostgresSpooling"]

log = logging.getLogger("tiergate.router")


class PostgresSpooling:
    """Spooling, holding and letting go of records (mixed into the ledger)."""

    where: str
    holder: str
    spool: LedgerSpool | None
    replayed: int
    dropped: int
    max_backlog: int
    _backlog: deque[LedgerEntry]
    _spooled: set[LedgerEntry]  # spooled, newest record not yet committed
    _appending: bool
    # Records a full backlog let go of, on disk only: in this process's file, and in its
    # former file (`_rotated`) that it writes from; their USD, by tenant, not yet written.
    _let_go: int
    _let_go_usd: dict[str, float]
    _rotated: Orphan | None
    _rotated_usd: dict[str, float]
    _rotated_records: int

    async def _replay(self, orphan: Orphan, holder: str | None = None) -> int:
        raise NotImplementedError

    def _settle(self, tenant: str, usd: float, *, committed: bool = True) -> None:
        raise NotImplementedError

    def _count_written(self, record: UsageRecord, before: UsageRecord | None) -> None:
        raise NotImplementedError

    async def _spool(self, batch: list[tuple[LedgerEntry, UsageRecord]]) -> bool:
        """Append the batch's records to the spool (off the event loop: an fsync); whether
        they are durable there."""
        if self.spool is None:
            return True  # no spool configured: held in memory, as documented
        records = [record for _, record in batch]
        self._appending = True  # the spool is not cleared under an append
        try:
            appended = await asyncio.to_thread(self.spool.append, records)
        finally:
            self._appending = False
        if not appended:
            log.error(
                "event=ledger_spool_refused where=%s records=%d spool_bytes=%d",
                self.where, len(records), self.spool.bytes,
            )  # fmt: skip
            return False
        for entry, record in batch:
            entry.spooled = record
            self._spooled.add(entry)
        return True

    def _clear_spool(self) -> None:
        """Empty the spool once every entry it holds has its newest record committed; when it
        holds records on disk only, go on in a new file and write the old one from disk."""
        spool = self.spool
        if spool is None or not spool.used or self._spooled or self._appending:
            return
        if self._let_go:
            if self._rotated is None:
                self._rotate(spool)
            return
        try:
            spool.clear()
        except OSError as exc:  # replayed later, idempotently
            log.warning("event=ledger_spool_clear_failed path=%s error=%s", spool.path, exc)

    def _beside_rotated(self, batch: list[tuple[LedgerEntry, UsageRecord]]) -> bool:
        """Whether `batch` must wait for the spool's former file to be written: it holds an
        entry let go of, whose older record the file may hold. Written beside the file's
        replay, both could find no row, insert, and count the attempt twice; held, it is
        written by the backlog writer, which writes the file too, one after the other."""
        return self._rotated is not None and any(entry.over_held for entry, _ in batch)

    def _rotate(self, spool: LedgerSpool) -> None:
        """Hand the spool's file over to `_write_rotated` (the backlog writer's next round).
        Every record of it that memory holds is committed (`_clear_spool`), so writing the
        file over the rows held moves nothing the live writes move; an entry let go of is
        written over its row too (`over_held`)."""
        try:
            self._rotated = spool.rotate()
        except OSError as exc:  # tried again at the next write
            log.warning("event=ledger_spool_rotate_failed path=%s error=%s", spool.path, exc)
            return
        self._rotated_usd, self._let_go_usd = self._let_go_usd, {}
        self._rotated_records, self._let_go = self._let_go, 0

    async def _write_rotated(self) -> None:
        """Write the records of the spool's former file (`_rotate`) over the rows held, then
        delete it; a failure leaves it, still locked, for the next round."""
        rotated = self._rotated
        if rotated is None:
            return
        try:
            await asyncio.to_thread(rotated.read)
            written = await self._replay(rotated, self.holder)
        except Exception as exc:  # the database is away again
            log.warning(
                "event=ledger_replay_failed where=%s path=%s error=%s",
                self.where, rotated.path, reason(exc),
            )  # fmt: skip
            return
        self._rotated = None
        self.replayed += written
        for tenant, usd in self._rotated_usd.items():
            self._settle(tenant, usd)
        self._rotated_usd, self._rotated_records = {}, 0
        try:
            rotated.done()
        except OSError as exc:  # written all the same; a file left is replayed again, in vain
            log.warning("event=ledger_spool_delete_failed path=%s error=%s", rotated.path, exc)
        log.warning(
            "event=ledger_spool_replayed where=%s path=%s records=%d written=%d unreadable=%d",
            self.where, rotated.path, len(rotated.records), written, rotated.unreadable,
        )  # fmt: skip
        self._clear_spool()  # the file now in use may hold records on disk only too

    def _hold(self, entry: LedgerEntry, record: UsageRecord) -> None:
        """Keep `entry` in the backlog after its write of `record` failed; with the backlog
        full, leave `record` to the disk if it is spooled, or else drop it."""
        if entry.held:
            return
        if len(self._backlog) < self.max_backlog:
            entry.held = True
            self._backlog.append(entry)
        elif entry.spooled is record and entry in self._spooled:
            self._let_go_of(entry, record)
        elif record is not entry.record:
            pass  # amended since: its newer record is queued, and has its own turn
        else:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.error("event=ledger_backlog_full where=%s dropped=%d", self.where, self.dropped)
            on_disk = entry.spooled if entry in self._spooled else None
            if on_disk is not None:  # an older record of the row is in the file: written from it
                self._count_written(record, on_disk)  # what only memory had, never to be written
                self._let_go_of(entry, on_disk)
            else:
                self._count_written(record, entry.written)  # never to be written
            # Settled up to `record`; the row holds an older record or none, so a later one
            # goes over what it holds (`over_held`), its USD counted from `record`.
            entry.written, entry.over_held = record, True

    def _let_go_of(self, entry: LedgerEntry, record: UsageRecord) -> None:
        """Leave `record`, spooled, to the disk: written from the spool's file once the backlog
        is (`_rotate`), so memory does not hold it meanwhile. Its USD is counted as not yet
        written until then; the entry takes the record as written, and its next write is
        written over the row the database holds (`over_held`), which the file may move."""
        grew = record.cost_usd - (entry.written.cost_usd if entry.written is not None else 0.0)
        if grew:
            self._let_go_usd[record.tenant] = self._let_go_usd.get(record.tenant, 0.0) + grew
        entry.written, entry.over_held = record, True
        self._spooled.discard(entry)
        self._let_go += 1
        if self._let_go == 1:
            log.warning("event=ledger_backlog_full where=%s on_disk_only=1", self.where)
