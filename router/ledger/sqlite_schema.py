"""The SQLite ledger's tables and statements, and a record's values for them."""

from __future__ import annotations

import logging
import sqlite3

from tiergate.router.ledger.records import LedgerError, UsageRecord, utc_day

__all__ = [
    "SCHEMA_VERSION",
    "ADD_TOTALS",
    "DAILY_TABLE",
    "DELETE",
    "INSERT",
    "SCHEMA",
    "SCHEMA_VERSION_TABLE",
    "UPDATE",
    "migrate",
    "row_values",
    "totals_delta",
]

log = logging.getLogger("tiergate.router")

SCHEMA_VERSION = 2

SCHEMA_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
# Per tenant, UTC day (Unix days: time_s // 86400) and tier served ('' for attempts no tier
# served): running totals, so neither a tenant's totals nor its spend in a budget period scans
# its requests, and pruning old request rows (retention) changes neither.
DAILY_TABLE = """CREATE TABLE IF NOT EXISTS tenant_daily (
        tenant TEXT NOT NULL,
        day INTEGER NOT NULL,
        tier_served TEXT NOT NULL,
        requests INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        cost_usd REAL NOT NULL,
        PRIMARY KEY (tenant, day, tier_served)
    ) WITHOUT ROWID"""
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS usage (
        id INTEGER PRIMARY KEY,
        request_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        time_s REAL NOT NULL,
        tenant TEXT NOT NULL,
        tier_requested TEXT NOT NULL,
        tier_served TEXT,
        pool TEXT,
        endpoint TEXT,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        latency_s REAL NOT NULL,
        ttft_s REAL,
        cost_usd REAL NOT NULL,
        http_status INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        escalated INTEGER NOT NULL
    )""",
    DAILY_TABLE,
)
INSERT = """
INSERT INTO usage (request_id, attempt, time_s, tenant, tier_requested, tier_served, pool,
    endpoint, prompt_tokens, completion_tokens, latency_s, ttft_s, cost_usd, http_status,
    outcome, escalated)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

UPDATE = """
UPDATE usage SET request_id = ?, attempt = ?, time_s = ?, tenant = ?, tier_requested = ?,
    tier_served = ?, pool = ?, endpoint = ?, prompt_tokens = ?, completion_tokens = ?,
    latency_s = ?, ttft_s = ?, cost_usd = ?, http_status = ?, outcome = ?, escalated = ?
WHERE id = ?
"""
DELETE = "DELETE FROM usage WHERE id = ?"

ADD_TOTALS = """
INSERT INTO tenant_daily VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, day, tier_served) DO UPDATE SET
    requests = requests + excluded.requests,
    attempts = attempts + excluded.attempts,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cost_usd = cost_usd + excluded.cost_usd
"""


def row_values(usage: UsageRecord) -> tuple[object, ...]:
    """A record's values, in `INSERT`'s and `UPDATE`'s order."""
    return (
        usage.request_id,
        usage.attempt,
        usage.time_s,
        usage.tenant,
        usage.tier_requested,
        usage.tier_served,
        usage.pool,
        usage.endpoint,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.latency_s,
        usage.ttft_s,
        usage.cost_usd,
        usage.http_status,
        usage.outcome,
        int(usage.escalated),
    )


def totals_delta(usage: UsageRecord, written: UsageRecord | None) -> tuple[object, ...]:
    """What writing `usage` over `written` (None: no row yet) adds to the daily totals, in
    `ADD_TOTALS`' order: a new row counts its attempt (and its request, for a first
    attempt); an amended one adds the difference, on the day it now says."""
    new = written is None
    return (
        usage.tenant,
        utc_day(usage.time_s),
        usage.tier_served or "",
        int(new and usage.attempt == 1),
        int(new),
        usage.prompt_tokens - (0 if written is None else written.prompt_tokens),
        usage.completion_tokens - (0 if written is None else written.completion_tokens),
        usage.cost_usd - (0.0 if written is None else written.cost_usd),
    )


def migrate(db: sqlite3.Connection, path: str) -> None:
    """Create the schema in the ledger `db` (at `path`) if absent, bring an older one up to
    date; LedgerError for a ledger written by a newer router."""
    # IMMEDIATE: two routers opening one new file do not both create the schema.
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(SCHEMA_VERSION_TABLE)
        (version,) = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        if version is not None and version > SCHEMA_VERSION:
            raise LedgerError(
                f"the usage ledger {path} has schema version {version}; this router "
                f"understands up to {SCHEMA_VERSION}: upgrade the router"
            )
        for statement in SCHEMA:
            db.execute(statement)
        if version is None:
            db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
        elif version == 1:
            _from_version_1(db, path)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _from_version_1(db: sqlite3.Connection, path: str) -> None:
    """Version 1 kept lifetime totals per tenant and tier, and read budget periods from the
    request rows through an index. Version 2 keeps the totals per day instead (built here
    from every row, once), so that request rows can be pruned; the index goes."""
    (rows,) = db.execute("SELECT COUNT(*) FROM usage").fetchone()
    log.info("event=ledger_migrating path=%s from=1 to=2 rows=%d", path, rows)
    db.execute(
        "INSERT INTO tenant_daily SELECT tenant, CAST(time_s / 86400 AS INTEGER),"
        " COALESCE(tier_served, ''), SUM(attempt = 1), COUNT(*), SUM(prompt_tokens),"
        " SUM(completion_tokens), SUM(cost_usd) FROM usage"
        " GROUP BY tenant, CAST(time_s / 86400 AS INTEGER), COALESCE(tier_served, '')"
    )
    db.execute("DROP TABLE IF EXISTS tenant_totals")
    db.execute("DROP INDEX IF EXISTS usage_tenant_time")
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
