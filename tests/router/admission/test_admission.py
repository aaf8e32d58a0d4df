"""A tier's admission queue when its endpoints change under waiting requests."""

import asyncio

from tiergate.router.admission import TierQueue


async def test_a_larger_capacity_admits_waiters_at_once() -> None:
    queue = TierQueue("batched", capacity=1, max_waiting=16)
    await queue.acquire("standard")  # the one slot, held by a long stream
    waiter = asyncio.create_task(queue.acquire("standard"))
    await asyncio.sleep(0)
    assert queue.waiting == 1 and not waiter.done()
    queue.resize(4, max_waiting=16)  # the tier scaled up
    await asyncio.wait_for(waiter, timeout=5)
    assert queue.active == 2 and queue.waiting == 0
    await asyncio.wait_for(queue.acquire("standard"), timeout=5)  # arrivals go straight in
    assert queue.active == 3


async def test_a_smaller_capacity_sheds_nothing_and_takes_effect_as_requests_end() -> None:
    queue = TierQueue("batched", capacity=2, max_waiting=16)
    first = await queue.acquire("standard")
    second = await queue.acquire("standard")
    queue.resize(1, max_waiting=16)
    assert queue.active == 2
    waiter = asyncio.create_task(queue.acquire("standard"))
    await asyncio.sleep(0)
    queue.release(first)  # 1 active: at capacity, the waiter still waits
    await asyncio.sleep(0)
    assert not waiter.done() and queue.waiting == 1
    queue.release(second)
    await asyncio.wait_for(waiter, timeout=5)
    assert queue.active == 1
