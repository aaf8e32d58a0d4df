"""A sim node's clock for tests that need requests to stay running."""

from __future__ import annotations

import asyncio

__all__ = ["GateClock"]


class GateClock:
    """A virtual clock whose steps end only once the gate is open: while it is shut, the
    engine's current step never finishes, so requests stay running (visible in metrics)."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.gate = asyncio.Event()

    def now(self) -> float:
        return self.now_s

    async def sleep_until(self, deadline_s: float) -> None:
        await self.gate.wait()
        self.now_s = max(self.now_s, deadline_s)
        await asyncio.sleep(0)
