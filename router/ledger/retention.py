"""Ledger retention: prune old request rows so that the usage ledger stops growing.

Every request adds a row, so without a limit the ledger fills its volume. Two limits,
each optional, from the router's settings:
- `ledgerRetentionDays`: request rows that finished longer ago than this go;
- `ledgerMaxSize`: while the database's pages in use exceed this, the oldest rows go.
Only request rows go. The daily totals per tenant and tier served stay (router/ledger/sqlite.py), so
bills, budgets and `/v1/usage` read the same before and after. Freed pages are reused by new
rows: the file stops growing; it does not shrink.

Pruning runs on the event loop, on the ledger's own connection, in batches of `BATCH_ROWS`
with the loop free between batches. A thread with a second connection would contend with
`record` for SQLite's write lock, and a waiting `record` sleeps in SQLite's busy handler
(1 ms, 2 ms, 5 ms...) while it holds the event loop. A round deletes at most
`MAX_ROWS_PER_ROUND` rows, several times what a busy router records in an interval, so a
backlog (retention just switched on for a big ledger) drains in the background.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from tiergate.router.base.background import LoopService
from tiergate.router.ledger.records import LedgerError
from tiergate.router.ledger.sqlite import Ledger
from tiergate.router.ledger.store import LedgerStore

__all__ = ["LedgerRetention"]

log = logging.getLogger("tiergate.router")

#: Seconds between pruning rounds.
INTERVAL_S = 1.0
#: Rows per DELETE: one transaction, with the event loop held for it (benchmarks/ledger_record.py
#: times a batch), kept small beside the router's per-token latency.
BATCH_ROWS = 200
#: Rows one round may delete: a few per cent of the loop while a backlog drains, and many times
#: what a router at full load records in a round, so a backlog does drain.
MAX_ROWS_PER_ROUND = 50_000


class LedgerRetention(LoopService):
    """Prunes `ledger` by age and/or size every `interval_s` while the app runs (a service)."""

    task_name = "ledger-retention"

    def __init__(
        self,
        ledger: LedgerStore,
        *,
        max_age_days: float | None = None,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        interval_s: float = INTERVAL_S,
        batch_rows: int = BATCH_ROWS,
        max_rows_per_round: int = MAX_ROWS_PER_ROUND,
    ) -> None:
        if max_bytes is not None and not isinstance(ledger, Ledger):
            raise ValueError("a size limit applies to the SQLite ledger only")
        self.ledger = ledger
        self.max_age_days = max_age_days
        self.max_bytes = max_bytes
        self._clock = clock  # Unix time: rows carry the Unix time they finished
        self._interval_s = interval_s
        self._batch_rows = batch_rows
        self._max_rows = max_rows_per_round
        self.pruned_rows = 0  # since start, for the metrics
        self.failures = 0
        self._over_size_logged = False

    @property
    def enabled(self) -> bool:
        return self.max_age_days is not None or self.max_bytes is not None

    def start(self) -> None:
        if self.enabled:
            super().start()

    async def _run(self) -> None:
        while True:
            try:
                await self.prune_round()
            except LedgerError as exc:
                # A full or read-only disk: records fail too and say so; try again next round.
                self.failures += 1
                log.warning("event=ledger_prune_failed error=%s", exc)
            await asyncio.sleep(self._interval_s)

    async def prune_round(self) -> int:
        """One round: rows past the age limit, then the oldest rows while over the size limit.
        Returns how many rows went."""
        deleted = 0
        if self.max_age_days is not None:
            before_s = self._clock() - self.max_age_days * 86400.0
            while deleted < self._max_rows:
                n = await self._prune(before_s)
                deleted += n
                if n < self._batch_rows:
                    break
                await asyncio.sleep(0)
        if self.max_bytes is not None:
            assert isinstance(self.ledger, Ledger)
            while deleted < self._max_rows and self.ledger.used_bytes() > self.max_bytes:
                n = await self._prune(None)
                deleted += n
                if n == 0:
                    self._say_over_size()
                    break
                await asyncio.sleep(0)
        return deleted

    async def _prune(self, before_s: float | None) -> int:
        n = await self.ledger.prune_rows(self._batch_rows, before_s)
        self.pruned_rows += n
        return n

    def _say_over_size(self) -> None:
        # Every request row is gone and the daily totals alone exceed the limit: nothing more
        # can be pruned. Said once, not every round.
        if not self._over_size_logged:
            self._over_size_logged = True
            log.warning(
                "event=ledger_over_max_size used_bytes=%d max_bytes=%d request_rows=0",
                self.ledger.used_bytes() if isinstance(self.ledger, Ledger) else 0,
                self.max_bytes,
            )
