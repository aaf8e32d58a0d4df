"""Budgets and rate limits over a fleet, on a real PostgreSQL server: three guards on one
database stand for three router replicas. A burst spread over them spends at most the budget
plus one request's hold per replica, and admits no more than one token bucket would; the same
burst against per-process guards (each replica its own SQLite ledger) spends about three
budgets, which is what the shared state is for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from private_ledger import private_ledger

from tiergate.router.base.errors import RouterError
from tiergate.router.ledger.postgres import PostgresLedger, open_check
from tiergate.router.ledger.records import UsageRecord
from tiergate.router.ledger.sqlite import Ledger
from tiergate.router.tenants.budgets import BudgetGuard
from tiergate.router.tenants.fleet_budgets import FleetBudgets
from tiergate.router.tenants.fleet_ratelimit import FleetRateLimiter
from tiergate.router.tenants.guards import Budgets, Limits
from tiergate.router.tenants.ratelimit import RateLimiter
from tiergate.router.tenants.registry import Tenant

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

BUDGET = 1.0
HOLD = 0.02  # the most a request may cost
COST = 0.01  # what each one costs
REPLICAS = 3


def tenant(**limits: object) -> Tenant:
    return Tenant(name="acme", **limits)  # type: ignore[arg-type]


def record(i: int, cost: float = COST) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{i}", time_s=time.time(), tenant="acme", tier_requested="batched",
        tier_served="batched", pool="p", endpoint="e", prompt_tokens=1, completion_tokens=1,
        latency_s=0.0, ttft_s=None, cost_usd=cost, http_status=200, outcome="ok",
    )  # fmt: skip


async def one_request(
    i: int, budgets: Budgets, ledger: PostgresLedger | Ledger, who: Tenant
) -> str:
    """What the router does for one request's budget: check, bill, release."""
    now = time.time()
    try:
        if budgets.needs_lease(who, HOLD, now):
            await budgets.lease(who, HOLD, now)
        hold = budgets.check(who, now, HOLD)
    except RouterError as error:
        return error.code
    try:
        await asyncio.sleep(0)  # other requests run while this one is in flight
        ledger.add(record(i))
        budgets.add(who, COST, now)
        await ledger.committed()
    finally:
        budgets.release(who, hold)
    return "ok"


@pytest.fixture
async def fleet(pg_dsn: str) -> AsyncIterator[list[tuple[PostgresLedger, FleetBudgets]]]:
    await open_check(pg_dsn)
    replicas = []
    for n in range(REPLICAS):
        ledger = PostgresLedger(pg_dsn)
        ledger.start()
        replicas.append((ledger, FleetBudgets(ledger, holder=f"replica-{n}")))
    yield replicas
    for ledger, _ in replicas:
        await ledger.stop()


async def test_a_burst_over_three_replicas_spends_at_most_the_budget_plus_a_hold_each(
    fleet: list[tuple[PostgresLedger, FleetBudgets]],
) -> None:
    who = tenant(budget_usd=BUDGET)
    outcomes = await asyncio.gather(
        *(one_request(i, fleet[i % 3][1], fleet[i % 3][0], who) for i in range(300))
    )
    spent = outcomes.count("ok") * COST
    assert spent <= BUDGET + REPLICAS * HOLD, outcomes
    status = await fleet[0][1].current(who)
    assert status.spent_usd == pytest.approx(spent)
    # Not a fleet that refuses everything: requests refused while others' leases held the
    # rest may leave some unspent, never most of it.
    assert spent >= BUDGET / 2, (spent, outcomes)
    assert set(outcomes) <= {"ok", "budget_exceeded"}


async def test_per_process_budgets_let_a_burst_spend_one_budget_per_replica(
    tmp_path: Path,
) -> None:
    """Today's single-process state, three times: the bypass the shared state closes."""
    who = tenant(budget_usd=BUDGET)
    replicas = []
    for n in range(REPLICAS):
        ledger = Ledger(tmp_path / f"{n}.sqlite")
        replicas.append((ledger, BudgetGuard(ledger)))
    outcomes = await asyncio.gather(
        *(one_request(i, replicas[i % 3][1], replicas[i % 3][0], who) for i in range(300))
    )
    spent = outcomes.count("ok") * COST
    assert spent > BUDGET + REPLICAS * HOLD  # past the bound the shared budgets hold
    for ledger, _ in replicas:
        ledger.close()


async def test_a_replica_gone_idle_gives_its_room_back(
    fleet: list[tuple[PostgresLedger, FleetBudgets]],
) -> None:
    who = tenant(budget_usd=BUDGET)
    (ledger_a, a), (_, b) = fleet[0], fleet[1]
    assert await one_request(0, a, ledger_a, who) == "ok"
    lease_a = a._leases["acme"]
    assert lease_a.granted_usd > HOLD  # a slice, not one request's worth
    await a.renew()  # active since the last renewal: a fresh slice
    await a.renew()  # idle now: only what is in flight, which is nothing
    assert lease_a.granted_usd == 0.0  # nothing in flight, nothing held back
    now = time.time()
    await b.lease(who, HOLD, now)
    assert b._leases["acme"].granted_usd >= (BUDGET - COST) / 4


async def test_a_lease_of_a_replica_that_died_is_void_after_its_time(pg_dsn: str) -> None:
    await open_check(pg_dsn)
    ledger = PostgresLedger(pg_dsn)
    ledger.start()
    try:
        who = tenant(budget_usd=BUDGET)
        dead = FleetBudgets(ledger, holder="dead", ttl_s=1.0)
        live = FleetBudgets(ledger, holder="live")
        now = time.time()
        await dead.lease(who, BUDGET, now)  # asks for everything: granted the whole budget
        assert dead._leases["acme"].granted_usd == pytest.approx(BUDGET)
        await live.lease(who, HOLD, now)
        with pytest.raises(RouterError) as refused:
            live.check(who, now, HOLD)
        assert refused.value.code == "budget_exceeded"
        assert refused.value.headers["Retry-After"] == "1"  # in flight elsewhere: temporary
        deadline = time.monotonic() + 30
        while True:  # the dead replica never renews: its lease lapses by the database's clock
            await live.lease(who, HOLD, time.time())
            if live._leases["acme"].granted_usd > 0:
                break
            assert time.monotonic() < deadline, "the dead replica's lease never lapsed"
            await asyncio.sleep(0.1)
        assert live.check(who, time.time(), HOLD) == HOLD
    finally:
        await ledger.stop()


async def test_while_the_database_is_down_a_replica_admits_within_its_lease_then_refuses() -> None:
    async with private_ledger(timeout_s=2.0) as (server, _, ledger):
        budgets = FleetBudgets(ledger)
        who = tenant(budget_usd=BUDGET)
        assert await one_request(0, budgets, ledger, who) == "ok"
        granted = budgets._leases["acme"].granted_usd
        await asyncio.to_thread(server.stop)
        outcomes = [await one_request(i, budgets, ledger, who) for i in range(1, 200)]
        admitted = outcomes.count("ok") + 1
        # Within the lease (plus the one hold the admission rule allows), then 503s.
        assert admitted * COST <= granted + HOLD
        assert outcomes[-1] == "budget_store_unavailable"
        assert set(outcomes) == {"ok", "budget_store_unavailable"}
        assert ledger.backlog > 0


async def admit(i: int, limiter: Limits, who: Tenant, tokens: int = 0) -> bool:
    try:
        if limiter.needs_lease(who, tokens):
            await limiter.lease(who, tokens)
        limiter.check(who, None, tokens)
    except RouterError as error:
        assert error.code == "rate_limit_exceeded" and int(error.headers["Retry-After"]) >= 1
        return False
    return True


async def bucket_level(pool: Any) -> float:
    """The shared requests bucket of tenant acme as the next take would find it (refilled by
    the database's clock: router/ledger/postgres_schema.py `tiergate_take_tokens`)."""
    level = await pool.fetchval(
        "SELECT LEAST(capacity, level + GREATEST(0, extract(epoch FROM clock_timestamp())"
        " - updated_s) * capacity / 60) FROM rate_bucket WHERE tenant = 'acme'"
        " AND kind = 'requests'"
    )
    return float(level)


async def test_a_burst_over_three_replicas_is_admitted_as_one_bucket_would(
    pg_dsn: str,
) -> None:
    await open_check(pg_dsn)
    ledgers = [PostgresLedger(pg_dsn) for _ in range(REPLICAS)]
    for ledger in ledgers:
        ledger.start()
    try:
        limiters = [FleetRateLimiter(ledger) for ledger in ledgers]
        who = tenant(requests_per_minute=60)
        started = time.monotonic()
        admitted = await asyncio.gather(*(admit(i, limiters[i % 3], who) for i in range(300)))
        elapsed_s = time.monotonic() - started
        # A full bucket, and what it refilled meanwhile (one request a second).
        assert sum(admitted) <= 60 + elapsed_s + 1
        assert sum(admitted) >= 60 - REPLICAS * 60 / 16  # slices not yet handed back
        # Slices go back: the shared bucket gains at least what the replicas did not spend.
        unused = sum(max(limiter._slices[("acme", "requests")].level, 0.0) for limiter in limiters)
        pool = await ledgers[0].connection_pool()
        before = await bucket_level(pool)
        for limiter in limiters:
            await limiter.renew(everything=True)
        after = await bucket_level(pool)
        assert after >= min(before + unused, 60.0) - 1e-6, (before, unused, after)  # float epochs
        # Once the one bucket holds a request (it may have been spent to the last token: it
        # refills one a second), the fleet admits again.
        deadline = time.monotonic() + 5.0
        while await bucket_level(pool) < 1.0:
            assert time.monotonic() < deadline, "the bucket never refilled"
            await asyncio.sleep(0.05)
        assert await admit(0, limiters[0], who)
    finally:
        for ledger in ledgers:
            await ledger.stop()


async def test_per_process_rate_limits_admit_one_allowance_per_replica() -> None:
    limiters = [RateLimiter() for _ in range(REPLICAS)]
    who = tenant(requests_per_minute=60)
    admitted = await asyncio.gather(*(admit(i, limiters[i % 3], who) for i in range(300)))
    assert sum(admitted) == 3 * 60


async def test_while_the_database_is_down_rate_limits_hold_per_replica() -> None:
    async with private_ledger(timeout_s=2.0) as (server, _, ledger):
        limiter = FleetRateLimiter(ledger)
        who = tenant(requests_per_minute=10)
        assert await admit(0, limiter, who)
        await asyncio.to_thread(server.stop)
        outcomes = [await admit(i, limiter, who) for i in range(1, 40)]
        assert 1 <= sum(outcomes) <= 10 + 1  # this replica's own bucket, not unlimited
        await asyncio.to_thread(server.start)
        deadline = time.monotonic() + 30
        while limiter._degraded:
            assert time.monotonic() < deadline, "never shared again"
            await limiter.renew()
            await asyncio.sleep(0.1)
