"""The SQLite ledger's reads: a tenant's totals and spend (the backlog counted in), its size,
and pruning its oldest request rows."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from typing import Protocol

from tiergate.router.base.tiers import Tier
from tiergate.router.ledger.records import (
    MAX_DAY,
    LedgerError,
    TierTotals,
    UsageRecord,
    UsageTotals,
    utc_day,
)
from tiergate.router.ledger.sqlite_schema import totals_delta

__all__ = ["SqliteReads", "prune", "spend_in_days", "tenant_totals", "used_bytes"]


class Held(Protocol):
    """A record waiting in the backlog: what its row is to say, and what the database has."""

    record: UsageRecord
    written: UsageRecord | None


def tenant_totals(db: sqlite3.Connection, backlog: Iterable[Held], tenant: str) -> UsageTotals:
    """A tenant's totals by tier served, from the daily totals and the backlog."""
    rows = db.execute(
        "SELECT tier_served, SUM(requests), SUM(attempts), SUM(prompt_tokens),"
        " SUM(completion_tokens), SUM(cost_usd) FROM tenant_daily WHERE tenant = ?"
        " GROUP BY tier_served",
        (tenant,),
    ).fetchall()
    sums = {row[0]: list(row[1:]) for row in rows}
    for held in backlog:
        if held.record.tenant == tenant:
            _, _, tier, *add = totals_delta(held.record, held.written)
            total = sums.setdefault(tier, [0, 0, 0, 0, 0.0])
            for i, value in enumerate(add):
                total[i] += value
    rows = sorted((tier, *total) for tier, total in sums.items())
    by_tier: dict[Tier, TierTotals] = {}
    for tier, _, attempts, prompt, completion, cost in rows:
        if tier:
            by_tier[tier] = TierTotals(attempts, prompt, completion, cost)
    return UsageTotals(
        requests=sum(row[1] for row in rows),
        attempts=sum(row[2] for row in rows),
        prompt_tokens=sum(row[3] for row in rows),
        completion_tokens=sum(row[4] for row in rows),
        cost_usd=sum(row[5] for row in rows),
        by_tier_served=by_tier,
    )


def spend_in_days(
    db: sqlite3.Connection,
    backlog: Iterable[Held],
    tenant: str,
    first_day: int,
    end_day: int | None,
) -> float:
    """USD a tenant spent on UTC days [first_day, end_day) (no end: to this day)."""
    end = MAX_DAY if end_day is None else end_day
    (spent,) = db.execute(
        "SELECT COALESCE(SUM(cost_usd), 0.0) FROM tenant_daily"
        " WHERE tenant = ? AND day >= ? AND day < ?",
        (tenant, first_day, end),
    ).fetchone()
    held = sum(
        e.record.cost_usd - (e.written.cost_usd if e.written is not None else 0.0)
        for e in backlog
        if e.record.tenant == tenant and first_day <= utc_day(e.record.time_s) < end
    )
    return float(spent) + held


def used_bytes(db: sqlite3.Connection) -> int:
    """Bytes of the database's pages in use (not on its free list; without the WAL)."""
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    (free,) = db.execute("PRAGMA freelist_count").fetchone()
    (page_size,) = db.execute("PRAGMA page_size").fetchone()
    return int((pages - free) * page_size)


def prune(db: sqlite3.Connection, limit: int, before_s: float | None) -> int:
    """Delete, of the `limit` oldest request rows, those that finished before `before_s` (all
    without it); how many went."""
    where = "" if before_s is None else " WHERE time_s < ?"
    params: tuple[float, ...] = (limit,) if before_s is None else (limit, before_s)
    cursor = db.execute(
        "DELETE FROM usage WHERE id IN (SELECT id FROM"
        f" (SELECT id, time_s FROM usage ORDER BY id LIMIT ?){where})",
        params,
    )
    return cursor.rowcount


class SqliteReads:
    """The SQLite ledger's reads, as methods of the ledger (router/ledger/sqlite.py)."""

    path: str
    _db: sqlite3.Connection
    _backlog: Iterable[Held]

    def commit_batch(self) -> None:
        raise NotImplementedError

    def wal_bytes(self) -> int:
        """The size of the ledger's WAL file now (0 in memory or when there is none)."""
        if self.path == ":memory:":
            return 0
        try:
            return os.stat(self.path + "-wal").st_size
        except OSError:
            return 0

    def tenant_totals(self, tenant: str) -> UsageTotals:
        """A tenant's totals over the whole ledger, overall and by tier served (from the daily
        totals: pruned request rows still count), the backlog included."""
        return tenant_totals(self._db, self._backlog, tenant)

    async def totals(self, tenant: str) -> UsageTotals:
        """`tenant_totals`, as the PostgreSQL ledger answers it."""
        return self.tenant_totals(tenant)

    async def prune_rows(self, limit: int, before_s: float | None) -> int:
        """`prune`, as the PostgreSQL ledger answers it."""
        return self.prune(limit, before_s=before_s)

    def spend_in_days(self, tenant: str, first_day: int, end_day: int | None = None) -> float:
        """USD a tenant spent in attempts that finished on UTC days [first_day, end_day), in
        Unix days (`utc_day`); no end: to this day. Reads one row per day and tier served, and
        the backlog."""
        return spend_in_days(self._db, self._backlog, tenant, first_day, end_day)

    def used_bytes(self) -> int:
        """Bytes of the database file in use (pages not on SQLite's free list; without the WAL).
        Pruned rows free their pages for new rows: the file stops growing, it does not shrink."""
        try:
            return used_bytes(self._db)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read the size of {self.path}: {exc}") from exc

    def prune(self, limit: int, *, before_s: float | None = None) -> int:
        """Delete request rows, oldest first: of the `limit` oldest rows, those that finished
        before `before_s` (all of them without it). Returns how many went.

        Only request rows go; the daily totals stay, so budgets, `tenant_totals` and
        `/v1/usage` are unchanged. The work is bounded by `limit` whatever the ledger's size:
        rows are read in insertion order, which is the order they finished in.
        """
        self.commit_batch()
        try:
            return prune(self._db, limit, before_s)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot prune the usage ledger {self.path}: {exc}") from exc
