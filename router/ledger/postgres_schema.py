"""The PostgreSQL ledger's tables, the functions budget and rate-limit leases run in, and the
versioned migration every router replica runs at start.

The request rows and daily totals are the SQLite ledger's (router/ledger/sqlite_schema.py), so
both answer alike. More tables hold what replicas share: `budget_lease` (what each replica
may have in flight of a tenant's budget), `rate_bucket` (each tenant's token buckets) and
`fair_share` (each process's demand per tier and tenant, for fair share across the fleet).
Their functions run each lease or exchange as one statement, in one round trip.

Several replicas may start at once: the migration runs under an advisory lock, and a database
of a newer schema version than this router's is refused.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.records import LedgerError, UsageRecord
from tiergate.router.ledger.sqlite_schema import totals_delta

__all__ = [
    "RENEW_LEASE",
    "SCHEMA_VERSION",
    "SELECT_FOR_REPLAY",
    "SWEEP",
    "WRITE_BATCH",
    "batch_arguments",
    "migrate",
]

log = logging.getLogger("tiergate.router")

SCHEMA_VERSION = 3
#: pg_advisory_xact_lock key held while the schema is created or migrated.
MIGRATION_LOCK = 0x7469657267617465  # "tiergate"

_TABLES = """
CREATE TABLE IF NOT EXISTS tiergate_schema (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    id bigserial PRIMARY KEY,
    request_id text NOT NULL,
    attempt integer NOT NULL,
    time_s double precision NOT NULL,
    tenant text NOT NULL,
    tier_requested text NOT NULL,
    tier_served text,
    pool text,
    endpoint text,
    prompt_tokens bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    latency_s double precision NOT NULL,
    ttft_s double precision,
    cost_usd double precision NOT NULL,
    http_status integer NOT NULL,
    outcome text NOT NULL,
    escalated boolean NOT NULL,
    UNIQUE (request_id, attempt)
);
CREATE TABLE IF NOT EXISTS router_lease (
    holder text PRIMARY KEY,
    expires_at double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS tenant_daily (
    tenant text NOT NULL,
    day integer NOT NULL,
    tier_served text NOT NULL,
    requests bigint NOT NULL,
    attempts bigint NOT NULL,
    prompt_tokens bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    cost_usd double precision NOT NULL,
    PRIMARY KEY (tenant, day, tier_served)
);
CREATE TABLE IF NOT EXISTS budget_lease (
    tenant text NOT NULL,
    holder text NOT NULL,
    period_start double precision NOT NULL,
    leased_usd double precision NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (tenant, holder)
);
CREATE TABLE IF NOT EXISTS rate_bucket (
    tenant text NOT NULL,
    kind text NOT NULL,
    capacity double precision NOT NULL,
    level double precision NOT NULL,
    updated_s double precision NOT NULL,
    PRIMARY KEY (tenant, kind)
);
"""

#: Version 2: each row names the router process that wrote it (`holder`), which keeps a lease
#: in `router_lease` while it lives, so a stream's row left `incomplete` by a process that died
#: can be closed (SWEEP).
_VERSION_2 = """
ALTER TABLE usage ADD COLUMN IF NOT EXISTS holder text;
CREATE INDEX IF NOT EXISTS usage_incomplete ON usage (holder) WHERE outcome = 'incomplete';
"""

#: Version 3: what each router process claims of each tier, per tenant, for fair share across
#: the fleet (router/fleet_share.py). A row lives until `expires_at` (the database's clock), so
#: a process that died stops claiming; tenant '' marks a process that serves the tier.
_VERSION_3 = """
CREATE TABLE IF NOT EXISTS fair_share (
    holder text NOT NULL,
    tier text NOT NULL,
    tenant text NOT NULL,
    weight double precision NOT NULL CHECK (weight > 0),
    holding integer NOT NULL CHECK (holding >= 0),
    waiting integer NOT NULL CHECK (waiting >= 0),
    served double precision NOT NULL CHECK (served >= 0),
    expires_at double precision NOT NULL,
    PRIMARY KEY (holder, tier, tenant)
);
"""

#: One exchange: replace the holder's claims with the ones given (living `p_ttl_s`), forget
#: rows expired a minute ago, and return every live claim, the holder's own included.
_SHARE_EXCHANGE = """
CREATE OR REPLACE FUNCTION tiergate_share_exchange(
    p_holder text, p_ttl_s double precision, p_tiers text[], p_tenants text[],
    p_weights double precision[], p_holding integer[], p_waiting integer[],
    p_served double precision[])
RETURNS TABLE (holder text, tier text, tenant text, weight double precision,
    holding integer, waiting integer, served double precision)
LANGUAGE plpgsql AS $$
DECLARE
    now_s double precision := extract(epoch FROM clock_timestamp());
BEGIN
    DELETE FROM fair_share AS f WHERE f.holder = p_holder OR f.expires_at < now_s - 60;
    INSERT INTO fair_share
        SELECT p_holder, c.*, now_s + p_ttl_s
        FROM unnest(p_tiers, p_tenants, p_weights, p_holding, p_waiting, p_served) AS c;
    RETURN QUERY SELECT f.holder, f.tier, f.tenant, f.weight, f.holding, f.waiting, f.served
        FROM fair_share AS f WHERE f.expires_at > now_s;
END $$;
"""

#: One budget lease, under the tenant's lock. The holder has `local` USD in flight (holds and
#: records not yet committed) and asks room for one more request's `hold`. What it may have in
#: flight is what the budget leaves after the period's committed spend and the other holders'
#: live leases (`room`); it is granted `local` plus a slice: at least the hold, else a quarter
#: of the room left (so contending replicas share it out), never more than the room. A grant
#: no larger than `local` means no room: the caller refuses the request. A negative `hold`
#: returns all but what is in flight (a holder gone idle). The lease row says at least `local`:
#: what others must count, since requests in flight may still spend it.
_LEASE_BUDGET = """
CREATE OR REPLACE FUNCTION tiergate_lease_budget(
    p_tenant text, p_holder text, p_first_day bigint, p_end_day bigint,
    p_period_start double precision, p_budget double precision, p_local double precision,
    p_hold double precision, p_ttl_s double precision,
    OUT spent double precision, OUT others double precision, OUT granted double precision,
    OUT expires_in_s double precision)
LANGUAGE plpgsql AS $$
DECLARE
    now_s double precision := extract(epoch FROM clock_timestamp());
    room double precision;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('tiergate-budget'), hashtext(p_tenant));
    SELECT COALESCE(SUM(cost_usd), 0) INTO spent FROM tenant_daily
        WHERE tenant = p_tenant AND day >= p_first_day AND day < p_end_day;
    SELECT COALESCE(SUM(leased_usd), 0) INTO others FROM budget_lease
        WHERE tenant = p_tenant AND holder <> p_holder AND period_start = p_period_start
        AND expires_at > now_s;
    room := p_budget - spent - others;
    IF p_hold < 0 THEN
        granted := LEAST(room, p_local);  -- an idle holder keeps what is in flight, no more
    ELSE
        granted := LEAST(room, p_local + GREATEST(p_hold, (room - p_local) / 4));
    END IF;
    -- Others must count what this holder has in flight, granted or not.
    INSERT INTO budget_lease VALUES (p_tenant, p_holder, p_period_start,
        GREATEST(p_local, granted, 0), now_s + p_ttl_s)
        ON CONFLICT (tenant, holder) DO UPDATE SET period_start = excluded.period_start,
        leased_usd = excluded.leased_usd, expires_at = excluded.expires_at;
    expires_in_s := p_ttl_s;
END $$;
"""

#: Take tokens from a tenant's shared bucket (created full), refilled at capacity per minute by
#: the database's clock. `p_give` first puts back tokens a holder did not use (never above the
#: capacity). Then, if the bucket holds `p_need`, `granted` is up to `p_want` of it; else
#: nothing, and `wait_s` is how long until it will.
_TAKE_TOKENS = """
CREATE OR REPLACE FUNCTION tiergate_take_tokens(
    p_tenant text, p_kind text, p_capacity double precision, p_give double precision,
    p_need double precision, p_want double precision,
    OUT granted double precision, OUT wait_s double precision)
LANGUAGE plpgsql AS $$
DECLARE
    now_s double precision := extract(epoch FROM clock_timestamp());
    b rate_bucket%ROWTYPE;
    lvl double precision;
BEGIN
    INSERT INTO rate_bucket VALUES (p_tenant, p_kind, p_capacity, p_capacity, now_s)
        ON CONFLICT DO NOTHING;
    SELECT * INTO b FROM rate_bucket WHERE tenant = p_tenant AND kind = p_kind FOR UPDATE;
    lvl := LEAST(p_capacity,
        b.level + GREATEST(0, now_s - b.updated_s) * p_capacity / 60 + GREATEST(p_give, 0));
    granted := 0;
    wait_s := 0;
    IF p_need > 0 THEN
        IF lvl >= p_need THEN
            granted := LEAST(GREATEST(lvl, p_need), p_want);
            lvl := lvl - granted;
        ELSE
            wait_s := (p_need - lvl) * 60 / p_capacity;
        END IF;
    END IF;
    UPDATE rate_bucket SET capacity = p_capacity, level = lvl,
        updated_s = GREATEST(b.updated_s, now_s)
        WHERE tenant = p_tenant AND kind = p_kind;
END $$;
"""


#: A batch in one statement (one round trip, atomic without BEGIN/COMMIT): its rows upserted by
#: request id and attempt, and the daily totals moved by the differences (keys sorted by the
#: caller, so replicas lock totals rows in one order and never deadlock).
WRITE_BATCH = """
WITH written AS (
    INSERT INTO usage (request_id, attempt, time_s, tenant, tier_requested, tier_served, pool,
        endpoint, prompt_tokens, completion_tokens, latency_s, ttft_s, cost_usd, http_status,
        outcome, escalated, holder)
    SELECT * FROM unnest($1::text[], $2::integer[], $3::float8[], $4::text[], $5::text[],
        $6::text[], $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::float8[],
        $12::float8[], $13::float8[], $14::integer[], $15::text[], $16::boolean[], $17::text[])
    ON CONFLICT (request_id, attempt) DO UPDATE SET time_s = excluded.time_s,
        tier_served = excluded.tier_served, pool = excluded.pool, endpoint = excluded.endpoint,
        prompt_tokens = excluded.prompt_tokens, completion_tokens = excluded.completion_tokens,
        latency_s = excluded.latency_s, ttft_s = excluded.ttft_s, cost_usd = excluded.cost_usd,
        http_status = excluded.http_status, outcome = excluded.outcome,
        escalated = excluded.escalated, holder = excluded.holder
    RETURNING 1
), counted AS (
    INSERT INTO tenant_daily
    SELECT * FROM unnest($18::text[], $19::integer[], $20::text[], $21::bigint[],
        $22::bigint[], $23::bigint[], $24::bigint[], $25::float8[])
    ON CONFLICT (tenant, day, tier_served) DO UPDATE SET
        requests = tenant_daily.requests + excluded.requests,
        attempts = tenant_daily.attempts + excluded.attempts,
        prompt_tokens = tenant_daily.prompt_tokens + excluded.prompt_tokens,
        completion_tokens = tenant_daily.completion_tokens + excluded.completion_tokens,
        cost_usd = tenant_daily.cost_usd + excluded.cost_usd
    RETURNING 1
)
SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM counted)
"""

#: A router process's lease: it lives until `expires_at` (the database's clock).
RENEW_LEASE = """
INSERT INTO router_lease VALUES ($1, extract(epoch FROM clock_timestamp()) + $2)
ON CONFLICT (holder) DO UPDATE SET expires_at = excluded.expires_at
"""

#: Close the rows of streams whose router process died mid-stream: `incomplete` rows whose
#: holder has no live lease become `interrupted`, billed for what they say; leases expired a
#: day ago are forgotten. How many rows were closed.
SWEEP = """
WITH live AS (
    SELECT holder FROM router_lease WHERE expires_at >= extract(epoch FROM clock_timestamp())
), closed AS (
    UPDATE usage SET outcome = 'interrupted'
    WHERE outcome = 'incomplete' AND holder IS NOT NULL AND holder NOT IN (SELECT holder FROM live)
    RETURNING 1
), forgotten AS (
    DELETE FROM router_lease WHERE expires_at < extract(epoch FROM clock_timestamp()) - 86400
    RETURNING 1
)
SELECT (SELECT count(*) FROM closed)
"""


async def migrate(conn: Any, where: str) -> None:
    """Create the schema in the database `conn` is connected to, if absent (`where` names it
    in messages); LedgerError for a database of a newer schema version than this router's."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute("CREATE TABLE IF NOT EXISTS tiergate_schema (version integer NOT NULL)")
        version = await conn.fetchval("SELECT MAX(version) FROM tiergate_schema")
        if version is not None and version > SCHEMA_VERSION:
            raise LedgerError(
                f"the usage ledger {where} has schema version {version}; this router "
                f"understands up to {SCHEMA_VERSION}: upgrade the router"
            )
        if version == SCHEMA_VERSION:
            return
        log.info(
            "event=ledger_schema_created where=%s version=%d from_version=%s",
            where, SCHEMA_VERSION, version,
        )  # fmt: skip
        await conn.execute(_TABLES)
        await conn.execute(_VERSION_2)
        await conn.execute(_VERSION_3)
        await conn.execute(_LEASE_BUDGET)
        await conn.execute(_TAKE_TOKENS)
        await conn.execute(_SHARE_EXCHANGE)
        await conn.execute("INSERT INTO tiergate_schema VALUES ($1)", SCHEMA_VERSION)


#: The rows a replay may overwrite, locked until it commits (columns in UsageRecord's order).
SELECT_FOR_REPLAY = """
SELECT request_id, time_s, tenant, tier_requested, tier_served, pool, endpoint, prompt_tokens,
    completion_tokens, latency_s, ttft_s, cost_usd, http_status, outcome, escalated, attempt
FROM usage WHERE (request_id, attempt) IN (SELECT * FROM unnest($1::text[], $2::integer[]))
ORDER BY request_id, attempt FOR UPDATE
"""


def batch_arguments(
    batch: list[tuple[LedgerEntry, UsageRecord]], holder: str
) -> list[list[object]]:
    """WRITE_BATCH's arguments for `batch`, its rows written by `holder`: the rows by column,
    then the daily totals' moves (from what each entry's row held before) by column, keys
    sorted."""
    rows = [(*_row(record), holder) for _, record in batch]
    totals: dict[tuple[str, int, str], list[float]] = {}
    for entry, record in batch:
        tenant, day, tier, *add = totals_delta(record, entry.written)
        key = (str(tenant), cast(int, day), str(tier))
        sums = totals.setdefault(key, [0, 0, 0, 0, 0.0])
        for i, value in enumerate(add):
            sums[i] += cast(float, value)
    daily = [(*key, *(int(v) for v in sums[:4]), float(sums[4]))
             for key, sums in sorted(totals.items())]  # fmt: skip
    return [
        *(list(column) for column in zip(*rows, strict=True)),
        *(list(column) for column in zip(*daily, strict=True)),
    ]


def _row(u: UsageRecord) -> tuple[object, ...]:
    return (
        u.request_id, u.attempt, u.time_s, u.tenant, u.tier_requested, u.tier_served, u.pool,
        u.endpoint, u.prompt_tokens, u.completion_tokens, u.latency_s, u.ttft_s, u.cost_usd,
        u.http_status, u.outcome, u.escalated,
    )  # fmt: skip
