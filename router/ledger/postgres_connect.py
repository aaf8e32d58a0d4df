"""Reaching the PostgreSQL ledger: naming it in messages without its credentials, and the check
`tiergate router` makes once before it serves."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import asyncpg

from tiergate.router.ledger.postgres_schema import migrate
from tiergate.router.ledger.records import LedgerError

__all__ = ["AMBIGUOUS", "CONNECT_TIMEOUT_S", "open_check", "reason", "where"]

#: How long connecting may take.
CONNECT_TIMEOUT_S = 5.0


#: Said of a URL that cannot be read, in place of the parser's words: they quote a piece of it,
#: which is part of the password when the password holds one of these characters.
UNREADABLE = (
    "its URL cannot be read (a password holding / # ? or @ must be percent-encoded, / as %2F)"
)


#: Said of a URL whose user or password may hold an unencoded `/`, `?` or `#`, in place of the
#: server it names: a URL parser would read part of the password as the host, port or path.
AMBIGUOUS = "postgresql://(not shown: its user or password may hold an unencoded / ? or #)"


def where(dsn: str) -> str:
    """The server and database a URL names, without its user or password (for messages)."""
    before, at, _ = dsn.partition("://")[2].rpartition("@")
    if at and any(c in before for c in "/?#"):
        return AMBIGUOUS
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "postgresql://(unreadable URL)"
    return f"postgresql://{host}{port}{parts.path or '/'}"


async def _connect(dsn: str) -> Any:
    try:
        return await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise LedgerError(f"cannot open the usage ledger {where(dsn)}: {reason(exc)}") from None
    except ValueError:
        # asyncpg parsing the URL: an unencoded character in the password splits it wrongly.
        raise LedgerError(f"cannot open the usage ledger: {UNREADABLE}") from None


def reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def open_check(dsn: str) -> None:
    """Connect once and create or migrate the schema: what `tiergate router` does before it
    serves, so an unreachable database, a refused login or a newer schema is one line."""
    conn = await _connect(dsn)
    try:
        await migrate(conn, where(dsn))
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise LedgerError(f"cannot open the usage ledger {where(dsn)}: {reason(exc)}") from None
    finally:
        await conn.close()
