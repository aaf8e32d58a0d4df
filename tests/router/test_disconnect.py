"""DisconnectGuard with a scripted ASGI receive channel."""

import asyncio

import pytest

from tiergate.router.asgi import ClientGone
from tiergate.router.disconnect import DisconnectGuard


class Channel:
    """`receive` after the body was read: nothing until the client disconnects."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.reads = 0

    async def receive(self) -> dict[str, str]:
        self.reads += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


async def test_a_quick_request_never_starts_watching() -> None:
    channel = Channel()
    guard = DisconnectGuard(channel.receive, delay_s=0.05)
    with guard.cancellable():
        await asyncio.sleep(0)
    guard.stop()
    await asyncio.sleep(0.1)
    assert channel.reads == 0 and guard._watcher is None


async def test_leaving_during_a_wait_ends_it_with_client_gone() -> None:
    channel = Channel()
    guard = DisconnectGuard(channel.receive, delay_s=0)
    never = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.05, channel.left.set)
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
    await asyncio.sleep(0.05)  # e.g. sending the reply: not cancellable
    assert guard.gone
    with pytest.raises(ClientGone):
        with guard.cancellable():
            pytest.fail("a wait for a client already gone must not start")
    guard.stop()


async def test_another_cancellation_passes_through() -> None:
    channel = Channel()

    async def request() -> None:
        guard = DisconnectGuard(channel.receive, delay_s=0)
        try:
            with guard.cancellable():
                await asyncio.sleep(10)
        finally:
            guard.stop()

    task = asyncio.create_task(request())
    await asyncio.sleep(0.05)
    task.cancel()  # the server shutting down, not the client leaving
    with pytest.raises(asyncio.CancelledError):
        await task
