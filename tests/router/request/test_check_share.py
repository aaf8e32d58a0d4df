"""The check workers' slots between tenants: a freed slot goes to the tenant that has spent
the least, and a check that has had its share gives way to a waiting tenant."""

from __future__ import annotations

import asyncio

import pytest

from tiergate.router.request.check_share import FairShare

#: Budget left per tenant (a stand-in for router/request/check_budget.py).
STANDING = {"alice": 2.0, "bob": 2.0, "carol": 1.99, "mallory": 0.5, "trudy": 0.1}


def share(slots: int = 1, share_s: float = 60.0) -> FairShare:
    return FairShare(slots, share_s=share_s, standing=STANDING.__getitem__)


def test_a_freed_slot_goes_to_the_waiter_with_the_most_budget_left() -> None:
    async def scenario() -> list[str]:
        slots = share()
        held = await slots.acquire("trudy", 1.0)
        assert held is not None
        order: list[str] = []

        async def wait(tenant: str) -> None:
            hold = await slots.acquire(tenant, 10.0)
            assert hold is not None
            order.append(tenant)
            await asyncio.sleep(0)
            slots.release(hold)

        waiting = [asyncio.create_task(wait(t)) for t in ("mallory", "bob", "alice")]
        while slots.waiting < 3:
            await asyncio.sleep(0)
        slots.release(held)
        await asyncio.gather(*waiting)
        return order

    # Bob and alice have as much left: the one who came first goes first.
    assert asyncio.run(scenario()) == ["bob", "alice", "mallory"]


def test_a_check_gives_way_after_its_share_to_a_tenant_that_has_spent_no_more() -> None:
    async def scenario() -> None:
        slots = share(slots=2, share_s=0.05)
        mallory = await slots.acquire("mallory", 1.0)
        alice = await slots.acquire("alice", 1.0)
        assert mallory is not None and alice is not None
        slots.begin(mallory)
        slots.begin(alice)
        bob = asyncio.create_task(slots.acquire("bob", 10.0))
        # Mallory has spent more than alice: hers is the check asked to give way.
        await asyncio.wait_for(mallory.give_way, 10.0)
        assert not alice.give_way.done() and not bob.done()
        slots.release(mallory)
        held = await bob
        assert held is not None and not held.give_way.done()
        slots.release(held)
        slots.release(alice)

    asyncio.run(scenario())


def test_a_fresh_tenant_s_slow_check_gives_way_as_it_spends_while_it_runs() -> None:
    """Bob has spent nothing yet, carol a little: bob's check, running, spends bob's budget,
    and soon he has spent more than carol."""

    async def scenario() -> None:
        slots = share(slots=1, share_s=0.05)
        bob = await slots.acquire("bob", 1.0)
        assert bob is not None
        slots.begin(bob)
        carol = asyncio.create_task(slots.acquire("carol", 10.0))
        await asyncio.wait_for(bob.give_way, 10.0)
        slots.release(bob)
        assert (await carol) is not None

    asyncio.run(scenario())


def test_a_check_does_not_give_way_to_a_tenant_that_has_spent_more() -> None:
    async def scenario() -> None:
        slots = share(slots=1, share_s=0.01)
        alice = await slots.acquire("alice", 1.0)
        assert alice is not None
        slots.begin(alice)
        assert await slots.acquire("mallory", 0.2) is None  # waited, and alice kept hers
        assert not alice.give_way.done() and slots.waiting == 0
        slots.release(alice)
        assert await slots.acquire("mallory", 0.0) is not None  # free again

    asyncio.run(scenario())


def test_a_waiter_that_leaves_takes_no_slot_with_it() -> None:
    async def scenario() -> None:
        slots = share(slots=1)
        held = await slots.acquire("alice", 1.0)
        assert held is not None
        leaving = asyncio.create_task(slots.acquire("bob", 10.0))
        while not slots.waiting:
            await asyncio.sleep(0)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        slots.release(held)
        assert await slots.acquire("mallory", 0.0) is not None

    asyncio.run(scenario())


def test_a_tenant_s_checks_run_one_at_a_time_and_a_cheap_one_keeps_its_slot() -> None:
    async def scenario() -> None:
        slots = share(slots=2)
        first = await slots.acquire("alice", 1.0)
        assert first is not None
        assert await slots.acquire("alice", 0.05) is None  # a slot is free, not for her
        mallory = await slots.acquire("mallory", 1.0)  # the free slot
        assert mallory is not None
        trudy = asyncio.create_task(slots.acquire("trudy", 10.0))
        second = asyncio.create_task(slots.acquire("alice", 10.0))
        while slots.waiting < 2:
            await asyncio.sleep(0)
        slots.release(first)  # trudy came first, but alice has spent less
        held = await second
        assert held is not None and held.tenant == "alice" and not trudy.done()
        slots.release(mallory)
        assert (await trudy) is not None

    asyncio.run(scenario())


def test_a_check_whose_worker_is_still_starting_is_not_asked_to_give_way() -> None:
    """Starting a worker is not the tenant's check: its share counts from when it begins."""

    async def scenario() -> None:
        slots = share(slots=1, share_s=0.01)
        mallory = await slots.acquire("mallory", 1.0)
        assert mallory is not None
        assert await slots.acquire("alice", 0.2) is None  # mallory's check had not begun
        assert not mallory.give_way.done()
        slots.begin(mallory)
        alice = asyncio.create_task(slots.acquire("alice", 10.0))
        await asyncio.wait_for(mallory.give_way, 10.0)
        slots.release(mallory)
        assert (await alice) is not None

    asyncio.run(scenario())
