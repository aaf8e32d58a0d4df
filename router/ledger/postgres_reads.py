"""The PostgreSQL ledger's reads: a tenant's totals and spend (every replica's committed records,
and this one's not yet committed), and pruning its oldest request rows.

A read the server cannot answer (stopped, unreachable, dropping connections) raises
LedgerError, which callers map to their own reply (`/v1/usage`: 503 `ledger_unavailable`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import asyncpg

from tiergate.router.base.tiers import Tier
from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.postgres_connect import reason
from tiergate.router.ledger.records import (
    MAX_DAY,
    LedgerError,
    TierTotals,
    UsageTotals,
    utc_day,
)
from tiergate.router.ledger.sqlite_schema import totals_delta

__all__ = ["PostgresReads"]


class PostgresReads:
    """The PostgreSQL ledger's reads, as methods of the ledger (router/ledger/postgres.py)."""

    _timeout_s: float
    where: str

    async def connection_pool(self) -> Any:
        raise NotImplementedError

    def _not_written(self) -> list[LedgerEntry]:
        raise NotImplementedError

    async def totals(self, tenant: str) -> UsageTotals:
        """A tenant's totals over the whole ledger, overall and by tier served (every replica's
        committed records, and this one's not yet committed)."""
        async with self._reading():
            pool = await self.connection_pool()
            rows = await pool.fetch(
                "SELECT tier_served, SUM(requests), SUM(attempts), SUM(prompt_tokens),"
                " SUM(completion_tokens), SUM(cost_usd) FROM tenant_daily WHERE tenant = $1"
                " GROUP BY tier_served",
                tenant,
                timeout=self._timeout_s,
            )
        sums: dict[str, list[float]] = {str(row[0]): [float(v) for v in row[1:]] for row in rows}
        for entry in self._not_written():
            if entry.record.tenant == tenant:
                _, _, tier, *add = totals_delta(entry.record, entry.written)
                total = sums.setdefault(str(tier), [0.0] * 5)
                for i, value in enumerate(add):
                    total[i] += cast(float, value)
        by_tier: dict[Tier, TierTotals] = {}
        for tier, (_, attempts, prompt, completion, cost) in sums.items():
            if tier:
                served = cast(Tier, tier)
                by_tier[served] = TierTotals(int(attempts), int(prompt), int(completion), cost)
        column = [sum(t[i] for t in sums.values()) for i in range(5)]
        return UsageTotals(
            requests=int(column[0]),
            attempts=int(column[1]),
            prompt_tokens=int(column[2]),
            completion_tokens=int(column[3]),
            cost_usd=column[4],
            by_tier_served=dict(sorted(by_tier.items())),
        )

    async def spend_in_days(self, tenant: str, first_day: int, end_day: int | None) -> float:
        """USD a tenant spent on UTC days [first_day, end_day) (no end: to this day), every
        replica's committed records and this one's not yet committed."""
        end = MAX_DAY if end_day is None else end_day
        async with self._reading():
            pool = await self.connection_pool()
            spent = await pool.fetchval(
                "SELECT COALESCE(SUM(cost_usd), 0) FROM tenant_daily"
                " WHERE tenant = $1 AND day >= $2 AND day < $3::bigint",
                tenant, first_day, end, timeout=self._timeout_s,
            )  # fmt: skip
        return float(spent) + sum(
            e.record.cost_usd - (e.written.cost_usd if e.written is not None else 0.0)
            for e in self._not_written()
            if e.record.tenant == tenant and first_day <= utc_day(e.record.time_s) < end
        )

    async def prune_rows(self, limit: int, before_s: float | None) -> int:
        """Delete, of the `limit` oldest request rows, those that finished before `before_s`
        (all of them without it); how many went. Daily totals stay."""
        where_old = "" if before_s is None else " AND time_s < $2"
        args: tuple[Any, ...] = (limit,) if before_s is None else (limit, before_s)
        pool = await self.connection_pool()
        status = await pool.execute(
            "DELETE FROM usage WHERE id IN (SELECT id FROM usage ORDER BY id LIMIT $1)" + where_old,
            *args,
            timeout=self._timeout_s,
        )
        return int(status.split()[-1])

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[None]:
        """LedgerError (one line, no URL) for a read the server could not answer."""
        try:
            yield
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise LedgerError(f"cannot read {self.where}: {reason(exc)}") from None
