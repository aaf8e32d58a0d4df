"""One attempt's row as a ledger writes it, whichever database keeps it."""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.router.ledger.records import UsageRecord

__all__ = ["LedgerEntry"]


@dataclass(slots=True, eq=False)
class LedgerEntry:
    """One attempt's row as the ledger writes it: `record` is what the row is to say, `rowid`
    and `written` what the database holds (None: no row yet)."""

    record: UsageRecord
    rowid: int | None = None
    written: UsageRecord | None = None
    held: bool = False  # in the backlog, to be written as `record` says then
    spooled: UsageRecord | None = None  # the newest record in the spool (PostgreSQL ledger)
    # Let go of by a full backlog, its record on disk only: what the database holds is unknown
    # until it is read, so its next write is written over the row held (PostgreSQL ledger).
    over_held: bool = False
