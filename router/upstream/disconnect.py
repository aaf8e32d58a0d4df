"""Noticing a client that leaves while the router waits on its behalf.

A request can wait long before its reply starts: for a slot in its tier's queue, and, when it
is not streamed, for the node's whole reply. A client that gives up meanwhile (a timeout, a
retry) leaves nothing to serve, yet without this the router would keep its place in the queue
and the node would decode the whole reply for nobody: under overload every client retry adds
abandoned work that live requests wait behind. (Streams watch for themselves once they start:
router/request/relay.py.)

The request's task reads `http.disconnect` off the ASGI `receive` channel (the body has been
read by then, so nothing else arrives on it). Watching costs a task, so it starts only once
the request has lasted `delay_s`; a quick request pays for a timer. A disconnect cancels the
request's task only while it is inside `cancellable()`, and the CancelledError that lands
there comes out as ClientGone: the handler already treats that as a client that left, and the
waits it interrupts clean up on cancellation (a queue waiter is discarded, an upstream request
is closed, which cancels the node's work).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from tiergate.router.base.asgi import ClientGone, Receive

#: How long a request runs before its client is watched.
WATCH_AFTER_S = 0.05


class Timer(Protocol):
    """What `call_later` returns (an asyncio.TimerHandle)."""

    def cancel(self) -> None: ...


class DisconnectGuard:
    """Watches one request's client; see the module docstring. Call `stop` when done.

    `call_later` schedules the start of the watch (the event loop's, unless a test drives
    time itself)."""

    def __init__(
        self,
        receive: Receive,
        delay_s: float = WATCH_AFTER_S,
        call_later: Callable[[float, Callable[[], None]], Timer] | None = None,
    ) -> None:
        self._receive = receive
        task = asyncio.current_task()
        assert task is not None, "a guard belongs to a request's task"
        self._task = task
        self._watcher: asyncio.Task[None] | None = None
        schedule = call_later or asyncio.get_running_loop().call_later
        self._timer: Timer | None = schedule(delay_s, self._start)
        self._waiting = False
        self.gone = False

    def _start(self) -> None:
        self._timer = None
        self._watcher = asyncio.create_task(self._watch(), name="tiergate-client-watch")

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._waiting:
            self._task.cancel()

    @contextmanager
    def cancellable(self) -> Iterator[None]:
        """A wait the client's departure ends early, with ClientGone."""
        if self.gone:
            raise ClientGone
        self._waiting = True
        try:
            yield
        except asyncio.CancelledError:
            if not self.gone:
                raise
            self._task.uncancel()
            raise ClientGone from None
        finally:
            self._waiting = False

    def stop(self) -> None:
        """Stop watching (the request is over, or a stream takes over its channel)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
