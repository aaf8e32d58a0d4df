"""A tier's admission queue (router/tier_queue.py): the order it grants slots in, who it
sheds when full, and what cancelled waiters leave behind. One event loop, no clock: a test
releases a slot and lets the loop run the task it was handed to."""

from __future__ import annotations

import asyncio

import pytest

from tiergate.router.base.tiers import Priority
from tiergate.router.tier_queue import (
    AdmissionOrder,
    FleetSlots,
    Grant,
    Shed,
    TenantQueueFull,
    TierQueue,
)

TOKENS = 100


async def settle() -> None:
    """Let every task that can run do so (a granted waiter records its grant)."""
    for _ in range(5):
        await asyncio.sleep(0)


class QueueDriver:
    """A queue and the waiters started on it; `granted` is the order slots were given in."""

    def __init__(
        self,
        capacity: int = 1,
        max_waiting: int = 64,
        order: AdmissionOrder = "fair",
        headroom: int = 0,
    ) -> None:
        self.queue = TierQueue("batched", capacity, max_waiting, order=order, headroom=headroom)
        self.granted: list[Grant] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def hold(self, tenant: str = "holder", tokens: int = 0, weight: float = 1.0) -> Grant:
        """Take a slot at once (the queue has room)."""
        grant = await self.queue.acquire("standard", tenant, weight=weight, tokens=tokens)
        self.granted.append(grant)
        return grant

    async def wait(
        self,
        tenant: str,
        *,
        weight: float = 1.0,
        tokens: int = TOKENS,
        priority: Priority = "standard",
        max_queued: int | None = None,
    ) -> asyncio.Task[None]:
        """Start a waiter and let it join the queue."""

        async def waiter() -> None:
            grant = await self.queue.acquire(
                priority, tenant, weight=weight, tokens=tokens, max_queued=max_queued
            )
            self.granted.append(grant)

        task = asyncio.create_task(waiter())
        self.tasks.append(task)
        await settle()
        return task

    async def serve(self, count: int, served_tokens: int | None = None) -> list[str]:
        """End the latest grant `count` times; the tenants the freed slots went to."""
        start = len(self.granted)
        for _ in range(count):
            self.queue.release(self.granted[-1], served_tokens)
            await settle()
        return [grant.tenant for grant in self.granted[start:]]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_fair_order_follows_the_weights() -> None:
    tier = QueueDriver()
    await tier.hold()
    for _ in range(12):
        for tenant, weight in (("a", 1.0), ("b", 1.0), ("c", 2.0)):
            await tier.wait(tenant, weight=weight)
    served = await tier.serve(16)
    for window in (served[:4], served[4:8], served[8:12], served[12:16]):
        assert sorted(window) == ["a", "b", "c", "c"], served
    await tier.close()


async def test_fcfs_order_follows_arrival_whatever_the_weights() -> None:
    tier = QueueDriver(order="fcfs")
    await tier.hold()
    arrivals = ["a", "a", "a", "b", "c", "c", "b", "a"]
    for tenant in arrivals:
        await tier.wait(tenant, weight=2.0 if tenant == "c" else 1.0)
    assert await tier.serve(len(arrivals)) == arrivals


async def test_a_tenant_that_was_idle_banks_no_credit() -> None:
    tier = QueueDriver()
    for _ in range(50):  # a served alone, nobody waiting: its counter grows
        tier.queue.release(await tier.hold("a", tokens=TOKENS), TOKENS)
    assert tier.queue.service("a") == 50 * TOKENS
    await tier.hold("a", tokens=TOKENS)
    for _ in range(6):
        await tier.wait("a")
    for _ in range(6):
        await tier.wait("b")
    # b starts at a's counter, not at 0: it alternates with a instead of taking six in a row.
    assert tier.queue.service("b") == tier.queue.service("a") == 51 * TOKENS
    assert await tier.serve(6) == ["a", "b", "a", "b", "a", "b"]
    await tier.close()


async def test_a_tenant_arriving_at_an_empty_queue_starts_at_the_last_served_counter() -> None:
    tier = QueueDriver()
    for _ in range(20):
        tier.queue.release(await tier.hold("a", tokens=TOKENS), TOKENS)
    grant = await tier.hold("b", tokens=TOKENS)  # straight in: no waiting, still lifted
    assert tier.queue.service("b") == 21 * TOKENS
    tier.queue.release(grant, TOKENS)


async def test_a_newcomer_is_lifted_to_the_last_tenant_s_corrected_counter() -> None:
    """Charged 100,000 tokens (its max_tokens) and corrected to the 10 it used, a's request
    must not leave the floor at 100,000: b, arriving at an idle tier, would start 100,000
    tokens behind a and wait while a was served that much more."""
    tier = QueueDriver()
    tier.queue.release(await tier.hold("a", tokens=100_000), 10)
    assert tier.queue.service("a") == 10
    await tier.hold("b", tokens=TOKENS)  # straight in, lifted to a's counter
    assert tier.queue.service("b") == 10 + TOKENS
    for tenant in ("a", "b", "a", "b", "a", "b"):
        await tier.wait(tenant, tokens=TOKENS)
    assert await tier.serve(6, served_tokens=TOKENS) == ["a", "b", "a", "b", "a", "b"]
    await tier.close()


@pytest.mark.parametrize(("a_used", "then"), [(None, "b"), (10, "a")])
async def test_the_served_tokens_correction_changes_the_order(
    a_used: int | None, then: str
) -> None:
    tier = QueueDriver()
    await tier.hold()
    for tenant, tokens in (("a", 1000), ("b", 100), ("a", 1000), ("b", 100), ("b", 100)):
        await tier.wait(tenant, tokens=tokens)
    assert await tier.serve(1) == ["a"]  # both at 0, a came first: a is charged 1000
    assert await tier.serve(1, served_tokens=a_used) == ["b"]  # a's request ends; b at 100
    # Corrected to the 10 it used, a (10) is below b (100) and goes next; uncorrected, not.
    assert await tier.serve(1) == [then]
    assert tier.queue.service("a") == (1000 if a_used is None else 10 + 1000)
    await tier.close()


async def test_priority_comes_before_any_counter() -> None:
    tier = QueueDriver()
    await tier.hold("heavy")
    await tier.wait("light")  # standard
    await tier.wait("light", priority="flex")
    await tier.wait("heavy", priority="premium")
    # heavy's request turns out to have used a million tokens: far over light's counter.
    assert await tier.serve(1, served_tokens=10**6) == ["heavy"]
    assert tier.queue.service("heavy") > tier.queue.service("light")
    assert await tier.serve(2) == ["light", "light"]
    assert [g.tenant for g in tier.granted] == ["heavy", "heavy", "light", "light"]


async def test_a_light_tenant_pushes_out_the_heaviest_tenant_s_latest_waiter() -> None:
    tier = QueueDriver(max_waiting=4)
    await tier.hold()
    heavy = [await tier.wait("heavy") for _ in range(3)]
    await tier.wait("light")
    assert tier.queue.waiting == 4
    await tier.wait("light")  # full: heavy has 3 waiting, light 1 (2 with this one)
    assert heavy[-1].done() and isinstance(heavy[-1].exception(), Shed)
    assert not any(task.done() for task in heavy[:2])
    assert (tier.queue.waiting_of("heavy"), tier.queue.waiting_of("light")) == (2, 2)
    assert tier.queue.shed_count == 1
    await tier.close()


async def test_the_heaviest_tenant_s_own_arrival_is_shed() -> None:
    tier = QueueDriver(max_waiting=4)
    await tier.hold()
    waiting = [await tier.wait("heavy") for _ in range(3)] + [await tier.wait("light")]
    with pytest.raises(Shed):
        await tier.queue.acquire("standard", "heavy", tokens=TOKENS)
    assert not any(task.done() for task in waiting)
    assert tier.queue.waiting == 4 and tier.queue.shed_count == 1
    await tier.close()


async def test_weight_counts_in_who_is_heaviest() -> None:
    tier = QueueDriver(max_waiting=4)
    await tier.hold()
    # big has 3 waiting at weight 4 (0.75 per unit), small 1 at weight 1 (1, 2 with the arrival).
    big = [await tier.wait("big", weight=4.0) for _ in range(3)]
    await tier.wait("small")
    with pytest.raises(Shed):
        await tier.queue.acquire("standard", "small", tokens=TOKENS)
    assert not any(task.done() for task in big)
    await tier.close()


async def test_a_higher_priority_arrival_pushes_out_a_lower_priority_waiter() -> None:
    tier = QueueDriver(max_waiting=2)
    await tier.hold()
    standard = await tier.wait("a")
    flex = await tier.wait("a", priority="flex")
    premium = await tier.wait("a", priority="premium")  # its own tenant: still goes in
    assert flex.done() and isinstance(flex.exception(), Shed)
    assert not standard.done() and not premium.done()
    with pytest.raises(Shed):  # a lower priority than every waiter: the arrival goes
        await tier.queue.acquire("flex", "b", tokens=TOKENS)
    assert await tier.serve(1) == ["a"]
    assert premium.done() and not standard.done()
    assert await tier.serve(1) == ["a"] and standard.done()


@pytest.mark.parametrize("order", ["fair", "fcfs"])
async def test_at_equal_priority_fcfs_sheds_the_arrival_fair_the_heaviest_s_latest(
    order: AdmissionOrder,
) -> None:
    tier = QueueDriver(max_waiting=3, order=order)
    await tier.hold()
    heavy = [await tier.wait("heavy") for _ in range(3)]
    arrival = await tier.wait("light")
    if order == "fcfs":
        assert isinstance(arrival.exception(), Shed)
        assert not any(task.done() for task in heavy)
    else:  # fair: the light tenant's arrival takes the heavy tenant's latest place
        assert not arrival.done() and isinstance(heavy[-1].exception(), Shed)
    await tier.close()


async def test_max_queued_refuses_a_tenant_s_extra_waiter_only() -> None:
    tier = QueueDriver()
    await tier.hold()
    await tier.wait("a", max_queued=2)
    await tier.wait("a", max_queued=2)
    with pytest.raises(TenantQueueFull) as caught:
        await tier.queue.acquire("standard", "a", tokens=TOKENS, max_queued=2)
    assert caught.value.waiting == 2
    await tier.wait("b", max_queued=2)  # another tenant's cap is its own
    assert tier.queue.waiting == 3
    # max_queued counts waiters only: with a free slot, a request is admitted whatever its cap.
    # (a and b start level: on the tie, b, with fewer waiting, goes first.)
    assert await tier.serve(3) == ["b", "a", "a"]
    tier.queue.release(tier.granted[-1])
    grant = await tier.queue.acquire("standard", "a", tokens=TOKENS, max_queued=1)
    assert grant.tenant == "a" and tier.queue.waiting == 0


async def test_cancelled_waiters_leave_no_count_behind() -> None:
    tier = QueueDriver()
    await tier.hold()
    gone = [await tier.wait("a") for _ in range(3)]
    stays = await tier.wait("b")
    for task in gone:
        task.cancel()
    await asyncio.gather(*gone, return_exceptions=True)
    assert tier.queue.waiting == 1 and tier.queue.waiting_of("a") == 0
    assert await tier.serve(1) == ["b"]
    assert stays.done() and tier.queue.active == 1 and tier.queue.waiting == 0


async def test_a_waiter_cancelled_as_it_is_granted_gives_its_slot_back() -> None:
    tier = QueueDriver()
    holder = await tier.hold()
    unlucky = await tier.wait("a")
    nextone = await tier.wait("b")
    tier.queue.release(holder)  # a is handed the slot...
    unlucky.cancel()  # ...and cancelled before its task ran
    await asyncio.gather(unlucky, return_exceptions=True)
    await settle()
    assert unlucky.cancelled()
    # Its slot went on to b: one active, nobody waiting, nothing leaked.
    assert nextone.done() and [g.tenant for g in tier.granted[-1:]] == ["b"]
    assert tier.queue.active == 1 and tier.queue.waiting == 0


async def test_a_waiter_cancelled_as_it_is_granted_is_not_charged() -> None:
    tier = QueueDriver()
    holder = await tier.hold()
    unlucky = await tier.wait("a", tokens=1000)
    await tier.wait("b")
    tier.queue.release(holder)
    unlucky.cancel()
    await asyncio.gather(unlucky, return_exceptions=True)
    assert tier.queue.service("a") == 0  # served nothing: charged nothing
    await tier.close()


async def test_a_pushed_out_waiter_cancelled_before_it_ran_leaves_nothing_behind() -> None:
    tier = QueueDriver(max_waiting=1)
    await tier.hold()
    pushed = await tier.wait("heavy")
    arrival = asyncio.create_task(tier.queue.acquire("premium", "light", tokens=TOKENS))
    await asyncio.sleep(0)  # the arrival pushes heavy's waiter out...
    pushed.cancel()  # ...which is cancelled before its task saw the Shed
    await asyncio.gather(pushed, return_exceptions=True)
    assert tier.queue.waiting == 1 and tier.queue.waiting_of("heavy") == 0
    tier.queue.release(tier.granted[-1])
    grant = await arrival
    assert grant.tenant == "light" and tier.queue.active == 1 and tier.queue.waiting == 0


async def test_a_waiter_cancelled_in_the_tick_its_slot_comes_is_skipped() -> None:
    tier = QueueDriver()
    holder = await tier.hold()
    gone = await tier.wait("a")
    stays = await tier.wait("b")
    gone.cancel()  # its future is cancelled now; its task has not run yet
    tier.queue.release(holder)  # the slot skips it
    await asyncio.gather(gone, stays, return_exceptions=True)
    assert gone.cancelled() and stays.done() and not stays.cancelled()
    assert tier.queue.active == 1 and tier.queue.waiting == 0


@pytest.mark.parametrize("order", ["fair", "fcfs"])
async def test_work_conserving_a_free_slot_is_never_left_while_someone_waits(
    order: AdmissionOrder,
) -> None:
    tier = QueueDriver(capacity=3, order=order)
    for tenant in ("a", "a", "b"):
        await tier.hold(tenant, tokens=TOKENS)
    for tenant in ("a", "b", "c", "c", "a", "b", "c"):
        await tier.wait(tenant, weight=3.0 if tenant == "c" else 1.0)
    gone = tier.tasks[1]
    gone.cancel()  # a cancelled waiter in the middle
    await asyncio.gather(gone, return_exceptions=True)
    while tier.queue.waiting:
        grant = tier.granted.pop(0)
        tier.queue.release(grant, TOKENS)
        await settle()
        # After every release: either every slot is taken or nobody waits.
        assert tier.queue.active == tier.queue.capacity or tier.queue.waiting == 0
    assert all(task.done() for task in tier.tasks)
    assert tier.queue.active == 3


# Headroom: slots held back for a tenant below its fair share.


async def test_a_flood_leaves_the_headroom_free_and_a_light_tenant_takes_it_at_once() -> None:
    tier = QueueDriver(capacity=8, headroom=1)
    for _ in range(7):
        await tier.hold("heavy", tokens=TOKENS)
    await tier.wait("heavy")  # the flood waits for the headroom's slot: not its own
    assert (tier.queue.active, tier.queue.waiting) == (7, 1)
    light = await tier.queue.acquire("standard", "light", tokens=TOKENS)  # no wait
    assert (light.tenant, tier.queue.active) == ("light", 8)
    # When the light request ends its slot is headroom again: the flood does not take it.
    tier.queue.release(light, TOKENS)
    await settle()
    assert (tier.queue.active, tier.queue.waiting) == (7, 1)
    # A flood request ending hands its own slot on to the flood's waiter.
    assert await tier.serve(1, TOKENS) == ["heavy"]
    await tier.close()


async def test_a_waiting_tenant_below_its_share_takes_a_headroom_slot_before_the_flood() -> None:
    """Slots freed below the headroom go in fair order; a slot that only the headroom has
    goes to a waiter below its share even when the flood's counter is lower."""
    tier = QueueDriver(capacity=4, headroom=1)
    for _ in range(3):
        await tier.hold("heavy", tokens=1)
    await tier.wait("heavy", tokens=1)
    light_hold = await tier.queue.acquire("standard", "light", tokens=TOKENS)  # the headroom
    await tier.wait("light", tokens=TOKENS)  # two light tenants' worth is over its share...
    await tier.wait("third", tokens=TOKENS)  # ...a third tenant is below its share
    tier.queue.release(light_hold, TOKENS)
    await settle()
    assert tier.granted[-1].tenant == "third"
    await tier.close()


@pytest.mark.parametrize("capacity", [1, 2, 3])
async def test_a_small_tier_holds_no_headroom(capacity: int) -> None:
    tier = QueueDriver(capacity=capacity, headroom=1)
    assert tier.queue.headroom == 0
    for _ in range(capacity):
        await tier.hold("heavy")
    assert tier.queue.active == capacity


async def test_fcfs_holds_no_headroom() -> None:
    assert QueueDriver(capacity=8, order="fcfs", headroom=2).queue.headroom == 0


async def test_slots_held_over_a_part_that_moved_take_none_of_a_fleet_processes_headroom() -> None:
    # Across a fleet (router/fleet_share.py) a held 2 of this process's 7 shared slots; then
    # its turn moved to another process, which the fleet makes wait until one of a's ends.
    tier = QueueDriver(capacity=8, headroom=1)
    elsewhere = ({"b": 1.0, "c": 2.0}, {"b": 2, "c": 3})
    tier.queue.share_fleet(FleetSlots({"a": 2}, 0, 7, *elsewhere))
    await tier.hold("a", tokens=TOKENS)
    await tier.hold("a", tokens=TOKENS)
    await tier.wait("a")
    # Had the fleet not held it back, a's second slot would take the headroom: nobody starts.
    tier.queue.share_fleet(FleetSlots({"a": 1}, 0, 7, *elsewhere))
    await tier.wait("light")
    assert (tier.queue.active, tier.queue.waiting) == (2, 2)
    # It does: the headroom slot is still free, the light tenant starts, a gets nothing more.
    tier.queue.share_fleet(FleetSlots({"a": 1}, 0, 7, *elsewhere, held_over={"a": 1}))
    await settle()
    light = tier.granted[-1]
    assert (light.tenant, tier.queue.active, tier.queue.waiting) == ("light", 3, 1)
    # One of a's ends: a holds its part, and the light tenant the headroom; a still waits.
    tier.queue.release(tier.granted[0], TOKENS)
    await settle()
    assert (tier.queue.active, tier.queue.waiting) == (2, 1)
    # The light request ends: its slot is headroom again, not a's.
    tier.queue.release(light, TOKENS)
    await settle()
    assert (tier.queue.active, tier.queue.waiting) == (1, 1)
    await tier.close()
