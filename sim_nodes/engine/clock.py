"""Clocks: where the engine's notion of "now" comes from.

Time is injected so the same engine runs against the wall clock in a sim node and against a
virtual clock in tests and simulations (STYLE.md: tests never sleep to wait for something).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "SleepingClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the time in seconds (monotonic, arbitrary origin)."""

    def now(self) -> float:
        """Current time in seconds."""
        ...


@runtime_checkable
class SleepingClock(Clock, Protocol):
    """A clock that also knows how to wait for one of its own instants.

    The realtime driver uses this when present, so a virtual clock can jump to the deadline
    instead of the driver sleeping on the wall clock.
    """

    async def sleep_until(self, deadline_s: float) -> None:
        """Return once `now() >= deadline_s`."""
        ...


class MonotonicClock:
    """The wall clock's monotonic time (`time.monotonic`)."""

    __slots__ = ()

    def now(self) -> float:
        """Seconds from `time.monotonic()`."""
        return time.monotonic()


class VirtualClock:
    """A clock that moves only when told to: set, advance, or jump to a deadline."""

    __slots__ = ("_now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now(self) -> float:
        """The current virtual time."""
        return self._now_s

    def set(self, now_s: float) -> None:
        """Move to `now_s`; time never goes backwards."""
        if now_s < self._now_s:
            raise ValueError(f"virtual time cannot go back from {self._now_s} to {now_s}")
        self._now_s = now_s

    def advance(self, seconds: float) -> None:
        """Move forward by `seconds` (>= 0)."""
        if seconds < 0:
            raise ValueError(f"cannot advance by a negative duration ({seconds})")
        self._now_s += seconds

    async def sleep_until(self, deadline_s: float) -> None:
        """Jump to the deadline at once, then yield so other tasks see the new time."""
        if deadline_s > self._now_s:
            self._now_s = deadline_s
        await asyncio.sleep(0)
