"""Drive an `Engine` in real time and stream each request's tokens as they are released.

One asyncio task runs steps back to back: `engine.step(start)` decides and prices a step,
the task sleeps until the step's end on the clock, then hands every released token to its
request's queue. The next step starts at the previous step's end (not when the task woke),
so scheduling lateness never accumulates; after an idle period the next step starts "now".

Sleeping: asyncio's timers overshoot by up to a millisecond (epoll's resolution). The driver
does not spin to hide that: on a 2-core machine a spinning node steals the CPU its clients,
its neighbours and the router need, and measured lateness was no better for it
(benchmarks/sim_node_stream.py). It only yields until the clock passes the deadline if a
timer fires early. With a clock that can sleep itself (`VirtualClock`) the driver lets it jump.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from .clock import Clock, MonotonicClock, SleepingClock
from .engine import Engine, StepOutcome
from .errors import EngineStoppedError
from .request import EngineRequest

__all__ = ["RealtimeEngine", "RequestStream", "TokenEvent"]

FINISH_ABORT = "abort"
#: Behind by more than this (e.g. the process was suspended), restart the timeline at now
#: instead of replaying the missed steps in a burst.
_MAX_LAG_S = 1.0


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """Tokens of one request released at `time_s` (a step's end)."""

    tokens: int  # new tokens released now (>= 1), or 0 on a final event without tokens
    time_s: float
    finished: bool
    finish_reason: str | None  # "length" | "abort" | None


class RequestStream:
    """The events of one submitted request. Iterate it; `cancel()` to abort.

    Iteration yields each `TokenEvent` and ends after the one with `finished=True`.
    """

    def __init__(
        self,
        owner: RealtimeEngine,
        request_id: str,
        prompt_tokens: int,
        max_output_tokens: int,
        submitted_s: float,
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.submitted_s = submitted_s
        self.first_token_s: float | None = None
        self.finished_s: float | None = None
        self.finish_reason: str | None = None
        self.output_tokens = 0
        self._owner = owner
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._ended = False  # the final event was yielded to the reader

    @property
    def finished(self) -> bool:
        """Whether the final event has been delivered (read or not)."""
        return self.finish_reason is not None

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event.finished:
            self._ended = True
        return event

    def cancel(self) -> None:
        """Abort the request (its KV blocks are freed at once); iteration ends. Idempotent."""
        self._owner._cancel(self)

    def _deliver(self, event: TokenEvent) -> None:
        if self.finish_reason is not None:
            return
        if event.tokens:
            if self.first_token_s is None:
                self.first_token_s = event.time_s
            self.output_tokens += event.tokens
        if event.finished:
            self.finish_reason = event.finish_reason
            self.finished_s = event.time_s
        self._queue.put_nowait(event)


class RealtimeEngine:
    """Runs `engine` against `clock` (the monotonic wall clock by default)."""

    def __init__(
        self,
        engine: Engine,
        clock: Clock | None = None,
        *,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """`on_failure` is told, once, why the step loop ended if an error ended it."""
        self._engine = engine
        self._on_failure = on_failure
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._last_submit_s = -math.inf
        #: The error that ended the step loop, if one did (`submit` refuses from then on).
        self.failure: BaseException | None = None

    @property
    def engine(self) -> Engine:
        """The driven engine (for stats: running, waiting, KV usage, preemptions)."""
        return self._engine

    @property
    def clock(self) -> Clock:
        """The clock steps are timed on."""
        return self._clock

    @property
    def num_streams(self) -> int:
        """Streams not yet finished (their final event not yet delivered)."""
        return len(self._streams)

    async def start(self) -> None:
        """Start the task that drives steps (no-op if already running)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drive(), name="tiergate-engine-driver")

    async def stop(self) -> None:
        """Stop driving; every unfinished stream ends with finish_reason "abort"."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for stream in list(self._streams.values()):
            self._cancel(stream)

    def submit(
        self,
        prompt_tokens: int,
        max_output_tokens: int,
        priority: int = 0,
        *,
        request_id: str | None = None,
    ) -> RequestStream:
        """Queue a request and return its stream. Raises EngineCapacityError (never fits),
        EngineError (bad values, duplicate id) or EngineStoppedError (the step loop failed)."""
        if self.failure is not None:
            raise EngineStoppedError(f"the engine's step loop failed: {_named(self.failure)}")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        now = self._clock.now()
        self._engine.add(EngineRequest(rid, prompt_tokens, max_output_tokens, priority, now))
        stream = RequestStream(self, rid, prompt_tokens, max_output_tokens, now)
        self._streams[rid] = stream
        self._last_submit_s = now
        self._wake.set()
        return stream

    # -- internals -----------------------------------------------------------------------------

    def _cancel(self, stream: RequestStream) -> None:
        if self._streams.pop(stream.request_id, None) is None:
            return  # already finished or cancelled
        self._engine.abort(stream.request_id)
        stream._deliver(TokenEvent(0, self._clock.now(), True, FINISH_ABORT))

    async def _drive(self) -> None:
        try:
            await self._drive_steps()
        except Exception as exc:
            # A crashed driver must not leave readers waiting forever, nor take new requests
            # that it would never serve.
            self.failure = exc
            for stream in list(self._streams.values()):
                self._cancel(stream)
            if self._on_failure is not None:
                self._on_failure(_named(exc))

    async def _drive_steps(self) -> None:
        engine, clock = self._engine, self._clock
        next_start: float | None = None  # None: idle, the next step starts "now"
        while True:
            if not engine.has_work:
                next_start = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = clock.now()
            start = now if next_start is None or now - next_start > _MAX_LAG_S else next_start
            # A step cannot start before a request it may admit arrived (the loop can wake
            # late); otherwise that request would see its tokens before it was submitted.
            start = max(start, self._last_submit_s)
            outcome = engine.step(start)
            if outcome is None:
                continue
            await self._sleep_until(outcome.end_s)
            self._release(outcome)
            next_start = outcome.end_s

    async def _sleep_until(self, deadline_s: float) -> None:
        clock = self._clock
        if isinstance(clock, SleepingClock):
            await clock.sleep_until(deadline_s)
            return
        delay = deadline_s - clock.now()
        if delay > 0:
            await asyncio.sleep(delay)
        while clock.now() < deadline_s:  # a timer that fired early
            await asyncio.sleep(0)

    def _release(self, outcome: StepOutcome) -> None:
        streams = self._streams
        finished = dict(outcome.finished)
        end_s = outcome.end_s
        for request_id, tokens in outcome.emitted:
            stream = streams.get(request_id)
            if stream is None:
                continue  # cancelled while the step ran
            reason = finished.pop(request_id, None)
            if reason is not None:
                del streams[request_id]
            stream._deliver(TokenEvent(tokens, end_s, reason is not None, reason))
        for request_id, reason in finished.items():
            stream = streams.pop(request_id, None)
            if stream is not None:
                stream._deliver(TokenEvent(0, end_s, True, reason))


def _named(exc: BaseException) -> str:
    """An error as `Type: message` (the engine's errors carry token counts, never text)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
