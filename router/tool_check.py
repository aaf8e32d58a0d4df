"""A cascade's tool-call check, run in a worker process with a deadline.

Tool schemas come from clients, and the arguments from a model the client prompts, so one
check can take as long as the client likes. A `pattern` such as `(a+)+$` backtracks
exponentially in Python's `re`, and `$ref`s inside `anyOf` let a schema of a few lines take
2^n steps. On the event loop, one such request would stall every request the router serves.

So the check (`cascade.tool_call_problem`) runs in a worker process, one check at a time per
worker, `WORKERS` workers. A check the worker has not answered within `timeout_s` is given up:
the worker is killed, and a later check forks a new one. A tenant's checks run one at a time,
so a tenant whose schemas are slow holds one worker and the others' checks still find one.
Waiting (for the tenant's previous check, then for a free worker) is bounded too (`wait_s`, by
default the same). A reply whose check was given up is served as it is, as
for a client schema that cannot be read: the cascade escalates for the model's mistakes, not
the client's. The router counts these in `tiergate_cascade_unchecked_total{reason}`.

The worker process, its memory cap (`MEMORY_HEADROOM_BYTES`, given up as `out_of_memory`)
and how it starts are router/check_worker.py. A reply without tool calls, which is most of
them, is checked in process: there is nothing to validate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from .check_worker import CheckWorker
from .tool_calls import tool_call_problem, tool_calls

__all__ = ["ToolCallChecker"]

log = logging.getLogger("tiergate.router")

#: How long a check may take in the worker, and how long it may wait for the worker.
CHECK_TIMEOUT_S = 1.0
#: Worker processes: one tenant's checks use one at a time, so a tenant sending slow schemas
#: holds one worker and leaves the others to everyone else.
WORKERS = 2
#: Address space a worker may add to what it has when it starts (jsonschema checking a tool
#: call needs a few MB).
MEMORY_HEADROOM_BYTES = 256 * 1024 * 1024


class ToolCallChecker:
    """Checks cascade replies' tool calls off the event loop (a service of the app)."""

    def __init__(
        self,
        *,
        timeout_s: float = CHECK_TIMEOUT_S,
        wait_s: float | None = None,
        workers: int = WORKERS,
        on_unchecked: Callable[[str], None] = lambda reason: None,
        memory_headroom_bytes: int = MEMORY_HEADROOM_BYTES,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.timeout_s = timeout_s
        self.memory_headroom_bytes = memory_headroom_bytes
        self.wait_s = timeout_s if wait_s is None else wait_s
        self._on_unchecked = on_unchecked
        self._slots = asyncio.Semaphore(workers)
        self._idle: list[CheckWorker] = []  # started, waiting for a check
        self._busy: set[CheckWorker] = set()
        # Per tenant: its lock (one check at a time) and how many checks hold or wait for it.
        self._tenants: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._stopped = False

    @property
    def workers(self) -> list[CheckWorker]:
        """The worker processes running now (idle or checking)."""
        return [*self._idle, *self._busy]

    def start(self) -> None:
        return None  # the first check with tool calls starts a worker

    async def stop(self) -> None:
        self._stopped = True
        for worker in self.workers:
            worker.kill()
        self._idle.clear()
        self._busy.clear()

    async def problem(
        self, reply: dict[str, Any], request: dict[str, Any], tenant: str = ""
    ) -> str | None:
        """`cascade.tool_call_problem(reply, request)`, or None when the check was given up.
        A tenant's checks run one at a time, so one tenant's slow schemas hold at most one
        worker and the others' checks still find one."""
        tools = request.get("tools")
        if not tools or not tool_calls(reply):
            return tool_call_problem(reply, request)  # nothing to validate: no worker needed
        lock, users = self._tenants.setdefault(tenant, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_s
            try:
                await asyncio.wait_for(lock.acquire(), self.wait_s)
            except TimeoutError:
                return self._unchecked("busy")
            try:
                try:
                    await asyncio.wait_for(self._slots.acquire(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    return self._unchecked("busy")
                try:
                    return await self._check((reply, {"tools": tools}))
                finally:
                    self._slots.release()
            finally:
                lock.release()
        finally:
            users[0] -= 1
            if not users[0]:
                del self._tenants[tenant]

    async def _check(self, payload: tuple[Any, Any]) -> str | None:
        """One check on an idle worker (started if none is), which holds a slot."""
        if self._idle:
            worker = self._idle.pop()
        else:
            try:
                worker = await asyncio.to_thread(CheckWorker, self.memory_headroom_bytes)
            except Exception as exc:  # no processes left, no /tmp for the fork server...
                return self._unchecked(f"worker_start: {type(exc).__name__}: {exc}")
        self._busy.add(worker)
        keep = False
        try:
            asking = asyncio.ensure_future(asyncio.to_thread(worker.ask, payload, self.timeout_s))
            try:
                status, value = await asyncio.shield(asking)
            except asyncio.CancelledError:
                # The answer still on its way would be read by the next check: start over.
                worker.kill()
                with contextlib.suppress(Exception):
                    await asking
                raise
            keep = status in ("ok", "failed")  # timeout, died, out_of_memory: replaced
            if status == "ok":
                return value
            return self._unchecked(status if status != "failed" else f"failed: {value}")
        finally:
            self._busy.discard(worker)
            if keep and not self._stopped:
                self._idle.append(worker)
            else:
                worker.kill()

    def _unchecked(self, reason: str) -> str | None:
        """Count and log a check given up; its verdict is None (serve the reply)."""
        self._on_unchecked(reason.split(":")[0])
        log.warning("event=cascade_check_given_up reason=%s", reason)
        return None
