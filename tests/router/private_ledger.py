"""A PostgreSQL ledger on a server of its own, for tests that stop and start the server (a
uniquely named module: conftest names clash)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from postgres_server import PostgresServer, started_server

from tiergate.router.ledger.postgres import PostgresLedger, open_check


@asynccontextmanager
async def private_ledger(
    **options: Any,
) -> AsyncIterator[tuple[PostgresServer, str, PostgresLedger]]:
    """A started ledger (`options` for PostgresLedger) on a new server, with the server and the
    ledger's database URL. The server is started again if the test left it stopped, so the
    ledger stops with its records written."""
    server = await asyncio.to_thread(started_server)
    try:
        dsn = server.dsn(await asyncio.to_thread(server.create_database))
        await open_check(dsn)
        ledger = PostgresLedger(dsn, **options)
        ledger.start()
        try:
            yield server, dsn, ledger
        finally:
            if not server.running():
                await asyncio.to_thread(server.start)
            await ledger.stop()
    finally:
        await asyncio.to_thread(server.close)
