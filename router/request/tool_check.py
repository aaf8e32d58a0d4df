"""A cascade's tool-call check, run in a worker process with a deadline, fairly between tenants.

Tool schemas come from clients, and the arguments from a model the client prompts, so one
check can take as long as the client likes: a `pattern` such as `(a+)+$` backtracks
exponentially in Python's `re`, and `$ref`s inside `anyOf` let a schema of a few lines take
2^n steps. On the event loop, one such request would stall every request the router serves.

So the check (`tool_calls.tool_call_problem`) runs in a worker process
(router/request/check_worker.py), one check at a time per worker, `WORKERS` workers. A check
that has used `timeout_s` of CPU time in its worker is given up (`timeout`), and the worker
replaced: the deadline measures the check, not the machine's load, so a cheap check on a busy
machine is answered late rather than given up. A worker that neither answers nor reaches that
deadline within `stall_s` of wall-clock time is given up on too (`stalled`). A reply whose
check was given up, for any reason, is served as it is, as for a client schema that cannot be
read: the cascade escalates for the model's mistakes, not the client's. The router counts
these in `tiergate_cascade_unchecked_total{reason}`. A reply without tool calls, which is most
of them, is checked in process: there is nothing to validate.

The workers are shared between tenants (without a tenants file, every client is the one
anonymous tenant), and no number of tenants sending slow schemas may keep the others' checks
waiting:

- A tenant's checks run one at a time, so a tenant holds one worker at most.
- Each tenant pays for the CPU time its checks use in the workers (for a check made to give
  way, or whose CPU time cannot be read, the time it held the worker) from a budget of
  worker-seconds (router/request/check_budget.py). A tenant that has spent it has its checks
  given up at once, with no worker (`over_budget`), until the budget refills; one log line
  says so when it starts, one when its checks run again.
- A freed worker goes to the waiting tenant with the most budget left, and a check that has
  run for `share_s` while another tenant waits gives way (`preempted`, the worker replaced):
  a tenant whose checks are cheap waits about `share_s` for a worker, not for the running
  checks' deadline (router/request/check_share.py).
- Waiting for a worker (behind the tenant's own earlier checks, too) is bounded (`wait_s`,
  by default `timeout_s`): past it, the check is given up as `busy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from tiergate.router.request.check_budget import CheckBudget
from tiergate.router.request.check_share import FairShare, Hold
from tiergate.router.request.check_worker import Answer, CheckWorker
from tiergate.router.request.tool_calls import tool_call_problem, tool_calls

__all__ = ["ToolCallChecker"]

log = logging.getLogger("tiergate.router")

#: CPU time a check may use in the worker, and how long it may wait for the worker.
CHECK_TIMEOUT_S = 1.0
#: Wall-clock time, as a multiple of the deadline, after which a worker that has neither
#: answered nor used its CPU deadline is given up on (stopped, or starved of CPU).
CHECK_STALL_FACTOR = 10.0
#: Worker processes: one tenant's checks use one at a time.
WORKERS = 2
#: How long a check may hold its worker while another tenant's check waits for one; checks of
#: well-formed schemas take a small fraction of it.
CHECK_SHARE_S = 0.1
#: A tenant's budget of check time, in worker-seconds: what it may spend at once (two checks
#: that run to their deadline), and how fast that comes back (a tenth of one worker's time).
TENANT_CHECK_BUDGET_S = 2.0
TENANT_CHECK_REFILL_PER_S = 0.1
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
        stall_s: float | None = None,
        workers: int = WORKERS,
        share_s: float = CHECK_SHARE_S,
        budget_s: float = TENANT_CHECK_BUDGET_S,
        refill_per_s: float = TENANT_CHECK_REFILL_PER_S,
        clock: Callable[[], float] = time.monotonic,
        on_unchecked: Callable[[str], None] = lambda reason: None,
        on_check_begun: Callable[[str], None] = lambda tenant: None,
        memory_headroom_bytes: int = MEMORY_HEADROOM_BYTES,
    ) -> None:
        """`timeout_s` is CPU time in the worker; `stall_s` (by default `CHECK_STALL_FACTOR`
        times it) and `wait_s` (by default `timeout_s`) are wall-clock time. `clock` is the
        budget's (how fast it refills); a check's cost is the CPU time it used in its worker.
        `on_unchecked(reason)` is called for each check given up, `on_check_begun(tenant)` as
        a check starts on its worker (twice for a check asked again on a fresh worker)."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.timeout_s = timeout_s
        self.memory_headroom_bytes = memory_headroom_bytes
        self.wait_s = timeout_s if wait_s is None else wait_s
        self.stall_s = timeout_s * CHECK_STALL_FACTOR if stall_s is None else stall_s
        self._on_unchecked = on_unchecked
        self._on_check_begun = on_check_begun
        self._budget = CheckBudget(capacity_s=budget_s, refill_per_s=refill_per_s, clock=clock)
        self._share = FairShare(workers, share_s=share_s, standing=self._budget.left_s)
        self._over_budget: set[str] = set()  # tenants told (logged) to have spent theirs
        self._idle: list[CheckWorker] = []  # started, waiting for a check
        self._busy: set[CheckWorker] = set()
        self._stopped = False

    @property
    def workers(self) -> list[CheckWorker]:
        """The worker processes running now (idle or checking)."""
        return [*self._idle, *self._busy]

    def tenants_over_budget(self) -> list[str]:
        """The tenants whose checks are given up now: they spent their budget."""
        return self._budget.spent_tenants()

    def start(self) -> None:
        return None  # the first check with tool calls starts a worker

    async def stop(self) -> None:
        self._stopped = True
        for worker in self._busy:
            worker.kill()  # its check, seeing it end, closes it
        for worker in self._idle:
            worker.close()
        self._idle.clear()
        self._busy.clear()

    async def problem(
        self, reply: dict[str, Any], request: dict[str, Any], tenant: str = ""
    ) -> str | None:
        """`tool_calls.tool_call_problem(reply, request)`, or None when the check was given up.
        A tenant's checks run one at a time, while it has budget left (see the module)."""
        tools = request.get("tools")
        if not tools or not tool_calls(reply):
            return tool_call_problem(reply, request)  # nothing to validate: no worker needed
        if self._spent(tenant):
            return self._unchecked("over_budget", tenant)
        hold = await self._share.acquire(tenant, self.wait_s)
        if hold is None:
            return self._unchecked("busy", tenant)
        used_s: list[float] = []  # CPU time of each run of the check (twice if a worker died)
        try:
            if self._spent(tenant):  # by a check of its own that ended while this one waited
                return self._unchecked("over_budget", tenant)
            return await self._check((reply, {"tools": tools}), hold, used_s)
        finally:
            self._budget.charge(tenant, sum(used_s))
            self._share.release(hold)

    async def _check(
        self,
        payload: tuple[Any, Any],
        hold: Hold,
        used_s: list[float],
        *,
        again_if_died: bool = True,
    ) -> str | None:
        """One check on an idle worker (started if none is), in the slot `hold`; the CPU time
        it used is appended to `used_s`. A worker that dies under a check (it was killed, or
        its start went wrong) is replaced and the check asked once more on a fresh one: its
        death says nothing of the reply; a check that kills the second worker too is given up
        as `died`."""
        if self._idle:
            worker = self._idle.pop()
        else:
            try:
                worker = await asyncio.to_thread(CheckWorker, self.memory_headroom_bytes)
            except Exception as exc:  # no processes left, no /tmp for the fork server...
                return self._unchecked(f"worker_start: {type(exc).__name__}: {exc}", hold.tenant)
        self._busy.add(worker)
        self._share.begin(hold)
        self._on_check_begun(hold.tenant)
        keep = False
        ended = False  # by the router, for another tenant or a client gone: not by the check
        asking: asyncio.Future[Answer] | None = None
        try:
            asking = asyncio.ensure_future(
                asyncio.to_thread(worker.ask, payload, self.timeout_s, self.stall_s)
            )
            try:
                await asyncio.wait((asking, hold.give_way), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                # The answer still on its way would be read by the next check: start over.
                ended = True
                worker.kill()
                with contextlib.suppress(Exception):
                    await asking
                raise
            if not asking.done():  # another tenant waits, and this check has had its share
                ended = True
                worker.kill()
                with contextlib.suppress(Exception):
                    await asking
                return self._unchecked("preempted", hold.tenant)
            answer = asking.result()
            status, value = answer.status, answer.value
            keep = status in ("ok", "failed")  # timeout, stalled, died, out_of_memory: replaced
            if status == "ok":
                return value
            if status == "died" and again_if_died and not self._stopped:
                log.warning("event=cascade_check_worker_died tenant=%s retrying=true", hold.tenant)
            else:
                reason = status if status != "failed" else f"failed: {value}"
                return self._unchecked(reason, hold.tenant)
        finally:
            used_s.append(_used_s(None if ended else asking, hold))
            self._busy.discard(worker)
            if keep and not self._stopped:
                self._idle.append(worker)
            elif asking is None or asking.done():
                worker.close()
            else:  # cancelled again while its thread was still asking: close when it is done
                worker.kill()
                asking.add_done_callback(lambda _: worker.close())
        return await self._check(payload, hold, used_s, again_if_died=False)

    def _spent(self, tenant: str) -> bool:
        """Whether the tenant's budget is spent; logs when that starts and when it ends."""
        spent = self._budget.spent(tenant)
        if spent and tenant not in self._over_budget:
            self._over_budget.add(tenant)
            log.warning(
                "event=cascade_checks_given_up tenant=%s reason=over_budget budget_s=%g "
                "refill_per_s=%g",
                tenant,
                self._budget.capacity_s,
                self._budget.refill_per_s,
            )
        elif not spent and tenant in self._over_budget:
            self._over_budget.discard(tenant)
            log.info("event=cascade_checks_resumed tenant=%s", tenant)
        return spent

    def _unchecked(self, reason: str, tenant: str) -> str | None:
        """Count and log a check given up; its verdict is None (serve the reply). A spent
        budget is logged once, when it starts (`_spent`), not for every check it gives up."""
        self._on_unchecked(reason.split(":")[0])
        if reason != "over_budget":
            log.warning("event=cascade_check_given_up tenant=%s reason=%s", tenant, reason)
        return None


def _used_s(asking: asyncio.Future[Answer] | None, hold: Hold) -> float:
    """What a check costs its tenant: the CPU time it used in its worker, or the time it held
    the worker where the router ended it (it held the worker while another tenant waited) or
    the CPU time is not known."""
    if asking is not None and asking.done() and not asking.cancelled():
        cpu_s = asking.result().cpu_s if asking.exception() is None else None
        if cpu_s is not None:
            return cpu_s
    return asyncio.get_running_loop().time() - hold.started_at
