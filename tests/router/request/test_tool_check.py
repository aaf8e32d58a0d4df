"""The cascade's tool-call check in its worker: client schemas that take forever are given up
while the event loop keeps serving, and the worker is replaced; tenants sending them spend
their budget of check time, and the others' checks are still answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tiergate.router.request.tool_check import ToolCallChecker

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

# Exponential backtracking in Python's re: 2^40 ways to split the a's before the "!" fails.
EVIL_PATTERN = {"type": "object", "properties": {"cmd": {"type": "string", "pattern": "^(a+)+$"}}}
EVIL_ARGUMENTS = '{"cmd": "' + "a" * 40 + '!"}'
# No regex at all: each level refers to the next twice, so a failing value is tried 2^40 times.
EXPONENTIAL_REFS: dict[str, Any] = {
    "$defs": {
        **{f"l{n}": {"anyOf": [{"$ref": f"#/$defs/l{n + 1}"}] * 2} for n in range(40)},
        "l40": {"type": "string"},
    },
    "type": "object",
    "properties": {"cmd": {"$ref": "#/$defs/l0"}},
}
# The same, on a string the node (or a test) puts in `cmd`: the leaf wants an integer.
EXPONENTIAL_STRING: dict[str, Any] = {
    "$defs": {**EXPONENTIAL_REFS["$defs"], "l40": {"type": "integer"}},
    "type": "object",
    "properties": {"cmd": {"type": "string", "$ref": "#/$defs/l0"}},
}
PLAIN = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}


def request(parameters: Any) -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "run", "parameters": parameters}}
    return {"model": "m", "messages": [], "tools": [tool]}


def reply(arguments: str) -> dict[str, Any]:
    call = {"id": "c", "type": "function", "function": {"name": "run", "arguments": arguments}}
    return {"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": [call]}}]}


class Checker(ToolCallChecker):
    """A checker that remembers why it gave up, and can be waited on until its checks begin."""

    def __init__(self, **kwargs: Any) -> None:
        self.given_up: list[str] = []
        self.begun: list[str] = []  # the tenant of each check that started on a worker
        self._one_begun = asyncio.Event()
        super().__init__(on_unchecked=self.given_up.append, on_check_begun=self._began, **kwargs)

    def _began(self, tenant: str) -> None:
        self.begun.append(tenant)
        self._one_begun.set()

    async def checks_begun(self, tenants: int, within_s: float = 10.0) -> None:
        """Return once checks of `tenants` different tenants have started on a worker, as the
        checker reports it (nothing is inferred from time passing); fail after `within_s`."""
        async with asyncio.timeout(within_s):
            while len(set(self.begun)) < tenants:
                self._one_begun.clear()
                await self._one_begun.wait()


async def ticking_while(work: Any) -> tuple[Any, int]:
    """Run `work`, counting how often a 10 ms ticker ran meanwhile (the loop was free)."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        return await work, ticks
    finally:
        task.cancel()


@pytest.mark.parametrize(
    ("schema", "arguments"),
    [(EVIL_PATTERN, EVIL_ARGUMENTS), (EXPONENTIAL_REFS, '{"cmd": 3}')],
    ids=["regex", "refs"],
)
def test_a_schema_that_takes_forever_is_given_up_and_the_loop_keeps_running(
    schema: dict[str, Any], arguments: str
) -> None:
    async def scenario() -> None:
        checker = Checker(timeout_s=0.5)
        try:
            problem, ticks = await ticking_while(checker.problem(reply(arguments), request(schema)))
            assert problem is None and checker.given_up == ["timeout"]
            assert ticks >= 3  # in process, the check would have held the loop for hours
            # A new worker answers the next check, a real problem included.
            bad = await checker.problem(reply('{"cmd": 3}'), request(PLAIN))
            assert bad is not None and "(type)" in bad
            assert await checker.problem(reply('{"cmd": "ls"}'), request(PLAIN)) is None
            assert checker.given_up == ["timeout"]
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_a_check_that_waits_too_long_for_the_worker_is_given_up_as_busy() -> None:
    async def scenario() -> None:
        checker = Checker(timeout_s=3.0, wait_s=0.2)
        try:
            slow = asyncio.create_task(
                checker.problem(reply(EVIL_ARGUMENTS), request(EVIL_PATTERN))
            )
            await checker.checks_begun(tenants=1)
            assert await checker.problem(reply('{"cmd": 3}'), request(PLAIN)) is None
            assert checker.given_up == ["busy"]
            assert await slow is None
            assert checker.given_up == ["busy", "timeout"]
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_a_tenant_with_slow_schemas_holds_one_worker_and_others_still_get_checked() -> None:
    async def scenario() -> None:
        checker = Checker(timeout_s=3.0, wait_s=0.3)
        try:
            slow = asyncio.create_task(
                checker.problem(reply(EVIL_ARGUMENTS), request(EVIL_PATTERN), "mallory")
            )
            await checker.checks_begun(tenants=1)
            # Mallory's next check waits for her first one and is given up; Alice's is checked.
            mallory, alice = await asyncio.gather(
                checker.problem(reply(EVIL_ARGUMENTS), request(EVIL_PATTERN), "mallory"),
                checker.problem(reply('{"cmd": 3}'), request(PLAIN), "alice"),
            )
            assert mallory is None and alice is not None and "(type)" in alice
            assert checker.given_up == ["busy"]
            assert await slow is None and checker.given_up == ["busy", "timeout"]
        finally:
            await checker.stop()
        assert checker.workers == []

    asyncio.run(scenario())


def test_a_schema_the_validator_cannot_handle_is_not_the_model_s_fault() -> None:
    async def scenario() -> None:
        checker = Checker()
        try:
            for broken in ({"type": 5}, {"properties": {"cmd": {"pattern": "("}}}):
                assert await checker.problem(reply('{"cmd": "x"}'), request(broken)) is None
            assert checker.given_up == ["failed", "failed"]
            workers = checker.workers
            assert await checker.problem(reply("{bad"), request(PLAIN)) is not None
            assert checker.workers == workers  # a failed check does not cost the worker
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_replies_without_tool_calls_never_start_a_worker() -> None:
    async def scenario() -> None:
        checker = Checker()
        text = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
        assert await checker.problem(text, request(PLAIN)) is None
        assert await checker.problem({"choices": []}, request(PLAIN)) == "the reply has no message"
        assert checker.workers == []

    asyncio.run(scenario())


def test_a_check_cancelled_midway_leaves_no_answer_behind() -> None:
    """The next check must not read the cancelled one's answer."""

    async def scenario() -> None:
        checker = Checker(timeout_s=5.0)
        try:
            slow = asyncio.create_task(
                checker.problem(reply(EVIL_ARGUMENTS), request(EVIL_PATTERN))
            )
            await checker.checks_begun(tenants=1)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            bad = await checker.problem(reply('{"cmd": 3}'), request(PLAIN))
            assert bad is not None and "(type)" in bad
            assert checker.given_up == []
        finally:
            await checker.stop()

    asyncio.run(scenario())


def ignored_signals(pid: int) -> set[int]:
    """The signals process `pid` ignores (Linux: the SigIgn mask in /proc/<pid>/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def test_ctrl_c_in_the_terminal_does_not_end_the_worker() -> None:
    """Ctrl-C reaches the whole process group; the worker leaves when the router says so."""

    async def scenario() -> None:
        checker = Checker()
        try:
            assert await checker.problem(reply('{"cmd": "ls"}'), request(PLAIN)) is None
            (worker,) = checker.workers
            assert worker.process.pid is not None
            # The kernel drops a signal the process ignores as it is sent: once os.kill
            # returns, the SIGINT has done all it ever will, and there is nothing to wait for.
            assert signal.SIGINT in ignored_signals(worker.process.pid)
            os.kill(worker.process.pid, signal.SIGINT)
            bad = await checker.problem(reply('{"cmd": 3}'), request(PLAIN))
            assert bad is not None and checker.workers == [worker] and checker.given_up == []
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_a_check_that_outgrows_the_worker_s_memory_is_given_up_and_the_worker_replaced() -> None:
    async def scenario() -> None:
        # Room for a 1 MB reply, not for one of 64 MB (decoding its arguments allocates that).
        checker = Checker(memory_headroom_bytes=32 * 1024 * 1024)
        try:
            assert await checker.problem(reply('{"cmd": "x"}'), request(PLAIN)) is None
            (worker,) = checker.workers
            limits = Path(f"/proc/{worker.process.pid}/limits").read_text()
            line = next(x for x in limits.splitlines() if x.startswith("Max address space"))
            assert line.split()[3] != "unlimited"
            huge = '{"cmd": "' + "x" * (64 * 1024 * 1024) + '"}'
            assert await checker.problem(reply(huge), request(PLAIN)) is None
            assert checker.given_up == ["out_of_memory"]
            assert checker.workers == [] and not worker.process.is_alive()
            # The next check gets a new worker and a verdict.
            assert await checker.problem(reply("{bad"), request(PLAIN)) is not None
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_two_tenants_holding_both_workers_with_slow_schemas_do_not_starve_a_third() -> None:
    """Two tenants' slow checks on both workers used to hold them to their deadline, so every
    other tenant's check waited for one and was given up as busy. A slow check
    now gives way to a waiting tenant after its share; the third tenant's check is checked."""

    async def scenario() -> None:
        checker = Checker(timeout_s=60.0, wait_s=10.0)
        try:
            slow = [
                asyncio.create_task(
                    checker.problem(reply(EVIL_ARGUMENTS), request(EVIL_PATTERN), tenant)
                )
                for tenant in ("mallory", "trudy")
            ]
            await checker.checks_begun(tenants=2)  # both workers hold a slow check
            alice = await checker.problem(reply('{"cmd": 3}'), request(PLAIN), "alice")
            assert alice is not None and "(type)" in alice  # checked, not given up
            assert checker.given_up == ["preempted"]  # one slow check gave way, once
            assert sum(not task.done() for task in slow) == 1
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_tenants_sending_slow_schemas_spend_their_budget_and_the_others_are_still_checked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three tenants send `$ref`-in-`anyOf` schemas nonstop, more than the two workers can
    hold; a fourth tenant's checks are all answered meanwhile. Each slow tenant's checks run
    until its budget is spent, and then are given up at once, without a worker; the log says
    so once per tenant, and never shows a schema or an argument."""
    abusers = ("eve", "mallory", "trudy")
    budget_s, share_s = 1.0, 0.1

    async def scenario() -> None:
        # The budget's clock stands still: a spent budget stays spent.
        checker = Checker(timeout_s=0.5, budget_s=budget_s, share_s=share_s, clock=lambda: 0.0)
        alice_done = False

        async def abuse(tenant: str) -> list[str]:
            """Slow checks until alice is done and this tenant is spent; then three more."""
            while not (alice_done and tenant in checker.tenants_over_budget()):
                await checker.problem(
                    reply('{"cmd": "alpha"}'), request(EXPONENTIAL_STRING), tenant
                )
                await asyncio.sleep(0)  # a check given up at once never leaves the loop
            before = len(checker.given_up)
            for _ in range(3):
                assert (
                    await checker.problem(
                        reply('{"cmd": "alpha"}'), request(EXPONENTIAL_STRING), tenant
                    )
                    is None
                )
            return checker.given_up[before:]

        try:
            abusing = [asyncio.create_task(abuse(t)) for t in abusers]
            await checker.checks_begun(tenants=2)  # both workers hold a slow check
            for n in range(12):
                arguments = '{"cmd": 3}' if n % 2 else '{"cmd": "ls"}'
                verdict = await checker.problem(reply(arguments), request(PLAIN), "alice")
                assert (verdict is not None) == bool(n % 2), (n, verdict, checker.given_up)
            alice_done = True
            last = await asyncio.wait_for(asyncio.gather(*abusing), 30)
        finally:
            await checker.stop()
        assert all(reasons == ["over_budget"] * 3 for reasons in last)  # no worker needed
        assert checker.tenants_over_budget() == list(abusers)
        assert set(checker.given_up) <= {"preempted", "timeout", "over_budget", "busy"}
        # Each check that ran cost its tenant its share of a worker at least.
        ran = [r for r in checker.given_up if r in ("preempted", "timeout")]
        assert len(ran) <= len(abusers) * budget_s / share_s
        messages = [r.getMessage() for r in caplog.records]
        assert not any("tenant=alice" in m for m in messages)  # none of hers was given up
        spent = sorted(m.split("tenant=")[1].split()[0] for m in messages if "over_budget" in m)
        assert spent == sorted(abusers)
        assert not any("$defs" in m or "alpha" in m or "cmd" in m for m in messages)

    caplog.set_level(logging.INFO, logger="tiergate.router")
    asyncio.run(scenario())


def test_a_check_whose_worker_dies_under_it_is_asked_again_on_a_fresh_one() -> None:
    """An idle worker killed from outside (the OOM killer, an operator): the next check finds
    it dead, and is answered by a fresh worker rather than given up; a reply's verdict does
    not depend on a worker's death."""

    async def scenario() -> None:
        checker = Checker()
        try:
            assert await checker.problem(reply('{"cmd": "ls"}'), request(PLAIN)) is None
            (dead,) = checker.workers
            assert dead.process.pid is not None
            os.kill(dead.process.pid, signal.SIGKILL)
            dead.process.join(10)
            verdict = await checker.problem(reply('{"cmd": 3}'), request(PLAIN))
            assert verdict is not None and "(type)" in verdict
            assert checker.given_up == []
            (fresh,) = checker.workers
            assert fresh is not dead
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_a_check_s_deadline_is_its_cpu_time_not_the_wall_clock_time_it_waited() -> None:
    """A cheap check whose worker gets no CPU for many times its deadline (stopped here, as an
    overloaded machine would starve it) is answered, not given up, once the worker runs; and
    its tenant pays for the CPU time it used, not for the wait."""

    async def scenario() -> None:
        # The budget's clock stands still, and the budget is smaller than the pause: charged
        # the wall-clock time it held the worker, the tenant would have spent it.
        checker = Checker(timeout_s=0.2, stall_s=60.0, budget_s=0.5, clock=lambda: 0.0)
        try:
            assert await checker.problem(reply('{"cmd": "ls"}'), request(PLAIN)) is None
            (worker,) = checker.workers
            assert worker.process.pid is not None
            os.kill(worker.process.pid, signal.SIGSTOP)
            try:
                check = asyncio.create_task(checker.problem(reply('{"cmd": 3}'), request(PLAIN)))
                # Five deadlines of wall-clock time pass with the check waiting for the CPU.
                await asyncio.wait({check}, timeout=5 * checker.timeout_s)
            finally:
                with contextlib.suppress(ProcessLookupError):  # given up and ended already
                    os.kill(worker.process.pid, signal.SIGCONT)
            verdict = await check
            assert verdict is not None and "(type)" in verdict
            assert checker.given_up == [] and checker.workers == [worker]
            assert checker.tenants_over_budget() == []
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_a_worker_that_neither_answers_nor_uses_its_cpu_is_given_up_on_as_stalled() -> None:
    """The wall-clock backstop: a stopped worker is replaced, and the next check answered."""

    async def scenario() -> None:
        checker = Checker(timeout_s=1.0, stall_s=0.2)
        try:
            assert await checker.problem(reply('{"cmd": "ls"}'), request(PLAIN)) is None
            (stopped,) = checker.workers
            assert stopped.process.pid is not None
            os.kill(stopped.process.pid, signal.SIGSTOP)
            assert await checker.problem(reply('{"cmd": 3}'), request(PLAIN)) is None
            assert checker.given_up == ["stalled"] and not stopped.process.is_alive()
            verdict = await checker.problem(reply('{"cmd": 3}'), request(PLAIN))
            assert verdict is not None and "(type)" in verdict
            assert checker.workers != [stopped]
        finally:
            await checker.stop()

    asyncio.run(scenario())


def test_a_check_that_runs_to_its_deadline_costs_its_tenant_the_deadline() -> None:
    """Ended by the kernel at its CPU deadline: given up as `timeout` (not as a worker that
    died, asked again), and charged that deadline."""

    async def scenario() -> None:
        checker = Checker(timeout_s=0.3, budget_s=0.5, clock=lambda: 0.0)
        try:
            slow = (reply(EVIL_ARGUMENTS), request(EVIL_PATTERN))
            assert await checker.problem(*slow, "mallory") is None
            assert checker.given_up == ["timeout"] and checker.tenants_over_budget() == []
            assert await checker.problem(*slow, "mallory") is None  # 0.6 s of a 0.5 s budget
            assert checker.given_up == ["timeout", "timeout"]
            assert checker.tenants_over_budget() == ["mallory"]
        finally:
            await checker.stop()

    asyncio.run(scenario())
