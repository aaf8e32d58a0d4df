"""DisconnectGuard with a scripted ASGI receive channel."""

import asyncio
from collections.abc import Callable

import pytest

from tiergate.router.base.asgi import ClientGone
from tiergate.router.upstream.disconnect import DisconnectGuard


class Channel:
    """`receive` after the body was read: nothing until the client disconnects."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.reads = 0

    async def receive(self) -> dict[str, str]:
        self.reads += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


class Timers:
    """`call_later` for a guard, with time driven by the test: `fire` runs what is due."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[float, Callable[[], None], asyncio.Handle]] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.Handle:
        handle = asyncio.Handle(lambda: None, (), asyncio.get_running_loop())
        self.scheduled.append((delay_s, callback, handle))
        return handle

    def fire(self) -> None:
        for _, callback, handle in self.scheduled:
            if not handle.cancelled():
                callback()


async def settled(condition: Callable[[], bool]) -> None:
    """Let the event loop run until `condition` holds (a bounded number of rounds)."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_quick_request_never_starts_watching() -> None:
    channel, timers = Channel(), Timers()
    guard = DisconnectGuard(channel.receive, delay_s=0.05, call_later=timers.call_later)
    with guard.cancellable():
        await asyncio.sleep(0)
    guard.stop()
    timers.fire()  # the delay passes: the timer was cancelled, nothing starts
    await asyncio.sleep(0)
    assert [d for d, _, _ in timers.scheduled] == [0.05]
    assert channel.reads == 0 and guard._watcher is None


async def test_a_slower_request_starts_watching_after_the_delay() -> None:
    channel, timers = Channel(), Timers()
    guard = DisconnectGuard(channel.receive, delay_s=0.05, call_later=timers.call_later)
    await asyncio.sleep(0)
    assert channel.reads == 0
    timers.fire()
    await settled(lambda: channel.reads == 1)
    guard.stop()


async def test_leaving_during_a_wait_ends_it_with_client_gone() -> None:
    channel = Channel()
    guard = DisconnectGuard(channel.receive, delay_s=0)
    never = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(channel.left.set)
    with pytest.raises(ClientGone):
        with guard.cancellable():
            await never
    assert guard.gone and never.cancelled()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # nothing left pending
    await asyncio.sleep(0)  # and the task goes on awaiting normally
    guard.stop()


async def test_leaving_outside_a_wait_cancels_nothing_and_the_next_wait_ends_at_once() -> None:
    channel = Channel()
    guard = DisconnectGuard(channel.receive, delay_s=0)
    channel.left.set()
    await settled(lambda: guard.gone)  # e.g. sending the reply: not cancellable
    with pytest.raises(ClientGone):
        with guard.cancellable():
            pytest.fail("a wait for a client already gone must not start")
    guard.stop()


async def test_another_cancellation_passes_through() -> None:
    channel = Channel()
    waiting = asyncio.Event()

    async def request() -> None:
        guard = DisconnectGuard(channel.receive, delay_s=0)
        try:
            with guard.cancellable():
                waiting.set()
                await asyncio.Event().wait()
        finally:
            guard.stop()

    task = asyncio.create_task(request())
    await waiting.wait()
    task.cancel()  # the server shutting down, not the client leaving
    with pytest.raises(asyncio.CancelledError):
        await task
