"""A service of the app that runs one coroutine in the background while the app runs."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["LoopService"]


class LoopService:
    """Runs `_run()` as a task from `start()` until `stop()` cancels it."""

    task_name = "tiergate-loop"
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        raise NotImplementedError
