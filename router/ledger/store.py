"""What the request path and the app need of a usage ledger, whichever database keeps it:
SQLite for one router process (router/ledger/sqlite.py), PostgreSQL for a fleet of them
(router/ledger/postgres.py)."""

from __future__ import annotations

from typing import Protocol

from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.records import UsageRecord, UsageTotals

__all__ = ["LedgerStore"]


class LedgerStore(Protocol):
    dropped: int

    @property
    def backlog(self) -> int: ...

    @property
    def refusing(self) -> bool: ...

    def add(self, usage: UsageRecord) -> LedgerEntry: ...

    def amend(self, entry: LedgerEntry, usage: UsageRecord) -> None: ...

    async def committed(self) -> None: ...

    async def totals(self, tenant: str) -> UsageTotals: ...

    async def prune_rows(self, limit: int, before_s: float | None) -> int: ...

    def close(self) -> None: ...
