"""Writing the ledger's backlog: records held in memory while the database refused writes.

`Ledger.record` holds a record it cannot write (router/ledger/sqlite.py says when and why); this
service tries the backlog every `interval_s`, on the event loop and without waiting for the
write lock, in batches of `batch_rows` with the loop free between them, so a backlog built up
during an outage drains in the background once the database takes writes again.
"""

from __future__ import annotations

import asyncio

from tiergate.router.base.background import LoopService
from tiergate.router.ledger.sqlite import Ledger

__all__ = ["LedgerBacklogWriter"]

#: Seconds between tries while records are held.
INTERVAL_S = 1.0
#: Records per batch, each its own transaction: small, so the event loop is soon free again
#: (benchmarks/ledger_record.py times a record).
BATCH_ROWS = 200


class LedgerBacklogWriter(LoopService):
    """Writes `ledger`'s backlog while the app runs (a service)."""

    task_name = "ledger-backlog-writer"

    def __init__(
        self, ledger: Ledger, *, interval_s: float = INTERVAL_S, batch_rows: int = BATCH_ROWS
    ) -> None:
        self.ledger = ledger
        self._interval_s = interval_s
        self._batch_rows = batch_rows

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            while self.ledger.backlog and self.ledger.flush_backlog(self._batch_rows):
                await asyncio.sleep(0)
