"""Fair share across the fleet through a real PostgreSQL (router/fleet_share.py): processes'
queues (real TierQueues, each with a FleetShare of its own) exchange their claims and fill
only their part of a tier; a process that stops or dies leaves its slots to the others; a
database that cannot be reached sends each process back to filling the tier on its own. And,
with the claims passed between processes in memory, how the processes a tenant waits in take
turns at its slot."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from private_ledger import private_ledger

from tiergate.router.base.tiers import Tier
from tiergate.router.fleet_allotment import Claim
from tiergate.router.fleet_share import FleetShare
from tiergate.router.ledger.postgres import PostgresLedger, open_check
from tiergate.router.tier_queue import FleetSlots, Grant, TierQueue

SLOTS = 8


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
async def ledger(pg_dsn: str) -> AsyncIterator[PostgresLedger]:
    await open_check(pg_dsn)
    one = PostgresLedger(pg_dsn)
    one.start()
    yield one
    await one.stop()


def process(
    ledger: PostgresLedger, holder: str, clock: Clock | None = None
) -> tuple[TierQueue, FleetShare]:
    """One router process's batched queue and its fair-share exchange."""
    queue = TierQueue("batched", SLOTS, 32)
    queues: dict[Tier, TierQueue] = {"batched": queue}
    share = FleetShare(ledger, lambda: queues, holder=holder, monotonic=clock or Clock())
    return queue, share


async def flood(queue: TierQueue, tenant: str, weight: float, n: int) -> list[asyncio.Task[Grant]]:
    """`n` requests of `tenant` asking `queue` for slots (admitted or waiting)."""
    tasks = [
        asyncio.create_task(queue.acquire("standard", tenant, weight=weight, tokens=10))
        for _ in range(n)
    ]
    await asyncio.sleep(0)
    return tasks


async def cancel(tasks: list[asyncio.Task[Grant]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_processes_fill_a_tier_by_their_tenants_weights(ledger: PostgresLedger) -> None:
    q1, p1 = process(ledger, "p1")
    q2, p2 = process(ledger, "p2")
    a = await flood(q1, "a", 1.0, 12)  # each fills the whole tier on its own, 4 waiting
    c = await flood(q2, "c", 2.0, 12)
    assert q1.active == q2.active == SLOTS
    try:
        assert await p1.exchange() and await p2.exchange() and await p1.exchange()
        # 12 each asked, 1:2: a 2.67 and c 5.33; the spare fraction to a (the larger one).
        assert q1.fleet is not None and q2.fleet is not None
        assert (dict(q1.fleet.tenants), dict(q2.fleet.tenants)) == ({"a": 3}, {"c": 5})
        assert q1.fleet.total + q2.fleet.total == SLOTS
        # p1 holds 8 of its 3: as its requests end, none of the waiters goes.
        for task in a[:5]:
            q1.release(task.result(), served_tokens=10)
        assert q1.active == 3 and q1.waiting == 4
        q1.release(a[5].result(), served_tokens=10)
        assert q1.active == 3 and q1.waiting == 3  # under its part: the next one goes
        assert p1.allotted() == {"batched": 3} and p1.shared
    finally:
        await cancel(a + c)
        await p1.stop()
        await p2.stop()


async def test_a_process_whose_claims_expire_leaves_its_slots_to_the_others(
    ledger: PostgresLedger,
) -> None:
    q1, p1 = process(ledger, "p1")
    q2, p2 = process(ledger, "p2")
    a = await flood(q1, "a", 1.0, 12)
    b = await flood(q2, "b", 1.0, 12)
    try:
        assert await p1.exchange() and await p2.exchange() and await p1.exchange()
        assert q1.fleet is not None and q1.fleet.total == 4
        # p2 dies: it publishes no more, and once its claims expire p1 gets the tier.
        deadline = asyncio.get_running_loop().time() + 10 * p1.ttl_s
        while q1.fleet is not None and q1.fleet.total < SLOTS:
            assert asyncio.get_running_loop().time() < deadline, "p2's slots never came back"
            await asyncio.sleep(0.05)
            assert await p1.exchange()
        assert q1.fleet is not None and dict(q1.fleet.tenants) == {"a": SLOTS}
    finally:
        await cancel(a + b)
        await p1.stop()
        await p2.stop()


async def test_a_process_that_stops_withdraws_its_claims_at_once(ledger: PostgresLedger) -> None:
    q1, p1 = process(ledger, "p1")
    q2, p2 = process(ledger, "p2")
    a = await flood(q1, "a", 1.0, 12)
    b = await flood(q2, "b", 1.0, 12)
    try:
        assert await p1.exchange() and await p2.exchange() and await p1.exchange()
        assert q1.fleet is not None and q1.fleet.total == 4
        await p2.stop()
        assert q2.fleet is None  # the stopped process's queue is on its own again
        assert await p1.exchange()
        assert q1.fleet is not None and q1.fleet.total == SLOTS
    finally:
        await cancel(a + b)
        await p1.stop()


async def test_an_idle_fleet_splits_the_tier_into_spare_slots_for_a_burst(
    ledger: PostgresLedger,
) -> None:
    q1, p1 = process(ledger, "p1")
    q2, p2 = process(ledger, "p2")
    try:
        assert await p1.exchange() and await p2.exchange() and await p1.exchange()
        assert q1.fleet is not None and q2.fleet is not None
        assert (q1.fleet.spare, q2.fleet.spare) == (4, 4)
        burst = await flood(q1, "a", 1.0, 6)  # 4 go at once, 2 wait for the next exchange
        assert q1.active == 4 and q1.waiting == 2
        assert await p1.exchange()
        # Its 6, and half the 2 slots left spare.
        assert q1.active == 6 and q1.fleet.total == 7 and q1.fleet.spare == 1
        await cancel(burst)
    finally:
        await p1.stop()
        await p2.stop()


async def test_an_unreachable_database_sends_each_process_back_on_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    async with private_ledger() as (server, dsn, ledger):
        q1, p1 = process(ledger, "p1", clock)
        q2, p2 = process(ledger, "p2", clock)
        a = await flood(q1, "a", 1.0, 12)
        b = await flood(q2, "b", 1.0, 12)
        try:
            assert await p1.exchange() and await p2.exchange() and await p1.exchange()
            assert q1.fleet is not None and q1.fleet.total == 4
            await asyncio.to_thread(server.stop)
            caplog.set_level(logging.WARNING, "tiergate.router")
            clock.now_s += p1.ttl_s / 2
            assert not await p1.exchange()
            assert q1.fleet is not None and p1.shared  # the last allotment holds a while
            clock.now_s += p1.ttl_s
            assert not await p1.exchange()
            assert q1.fleet is None and not p1.shared and p1.allotted() == {}
            assert q1.capacity == SLOTS and q1.has_room() is False
            assert sum("event=fair_share_local" in r.message for r in caplog.records) == 1
            assert not await p1.exchange()  # logged once while it lasts
            assert sum("event=fair_share_local" in r.message for r in caplog.records) == 1
            assert p1.failures == 3
            await asyncio.to_thread(server.start)
            assert await p1.exchange() and p1.shared
        finally:
            await cancel(a + b)
            await p1.stop()
            await p2.stop()


async def test_a_request_held_over_a_moved_part_ending_is_exchanged_at_once(
    ledger: PostgresLedger,
) -> None:
    # A period far longer than the test: only the ending request can bring an exchange.
    queue = TierQueue("batched", SLOTS, 32, headroom=1)
    share = FleetShare(ledger, lambda: {"batched": queue}, holder="p1", period_s=3600.0)
    a = await flood(queue, "a", 1.0, 2)
    share.start()
    try:
        for _ in range(400):
            if share.exchanges:
                break
            await asyncio.sleep(0.05)
        assert share.exchanges == 1
        # a's part moved away while it held 2: the fleet holds one back where the part went.
        queue.share_fleet(FleetSlots({"a": 1}, 0, SLOTS - 1, {}, {}, held_over={"a": 1}))
        queue.release(a[0].result(), served_tokens=10)
        for _ in range(400):
            if share.exchanges > 1:
                break
            await asyncio.sleep(0.05)
        assert (share.exchanges, share.early_exchanges) == (2, 1)
        # Another of a's ending, no longer held over its part, brings none.
        queue.release(a[1].result(), served_tokens=10)
        await asyncio.sleep(0.5)
        assert share.exchanges == 2
    finally:
        await share.stop()


async def test_the_processes_a_tenant_waits_in_take_turns_at_its_slot() -> None:
    # y holds 7 of the 8 slots in p1 all along; x has two clients in each process, asking
    # again as soon as a request ends. x's one slot is a third each: left to itself, the
    # process holding it would hand it to its next client at every exchange.
    clock = Clock()
    unopened = PostgresLedger("postgresql://localhost/unused")  # exchanged in memory instead
    processes = [process(unopened, holder, clock) for holder in ("p1", "p2", "p3")]
    y = await flood(processes[0][0], "y", 7.0, 7)
    x = [await flood(queue, "x", 1.0, 2) for queue, _ in processes]
    ran = [0, 0, 0]
    held: list[int] = []  # x's slots across the fleet after each exchange
    try:
        for _ in range(30):
            rows = [row for _, share in processes for row in share.claims()]
            for _, share in processes:
                share.apply(rows)
            await asyncio.sleep(0)
            held.append(sum(queue.holding_of("x") for queue, _ in processes))
            # Till the next exchange, every request of x running ends and its client asks again.
            clock.now_s += processes[0][1].period_s
            for i, (queue, _) in enumerate(processes):
                ended = [task for task in x[i] if task.done()]
                for task in ended:
                    queue.release(task.result(), served_tokens=10)
                ran[i] += len(ended)
                x[i] = [task for task in x[i] if not task.done()]
                x[i] += [asyncio.create_task(queue.acquire("standard", "x")) for _ in ended]
            await asyncio.sleep(0)
        assert min(ran) >= 5, ran
        # Once what each process admitted on its own ended, never more than x's one slot.
        assert max(held[1:]) == 1, held
        assert processes[0][0].holding_of("y") == 7
    finally:
        await cancel(y + [task for tasks in x for task in tasks])


def test_a_queue_made_since_the_claims_fills_its_slots_alone_until_it_is_claimed() -> None:
    """A new view made a queue (a tier's models now queue apart) between this process's claims
    and the exchange's answer: nobody claimed it, so the fleet's allotment gives it nothing.
    It fills its own slots until the next exchange claims it, rather than none."""
    claimed = TierQueue("batched", SLOTS, 32)
    new = TierQueue("batched", SLOTS, 32, name="batched:big")
    share = FleetShare(None, lambda: {"batched": claimed, "batched:big": new}, holder="a")  # type: ignore[arg-type]
    rows = [("batched", Claim("a", "", 1.0, 0, 0)), ("batched", Claim("b", "", 1.0, 0, 0))]
    share.apply(rows)
    assert claimed.fleet is not None and new.fleet is None
    assert new.has_room()
