"""The realtime driver: streams, ordering, finish reasons, cancel, stop.

Real-clock tests use a tiny deployment (steps of ~7 ms) and short outputs and assert only
counts, order and reasons, never timings. Virtual-clock tests let the clock jump.
"""

from __future__ import annotations

import asyncio

import pytest

from tiergate.sim_nodes.engine import (
    Engine,
    EngineCapacityError,
    EngineStoppedError,
    RealtimeEngine,
    RequestStream,
    TokenEvent,
    VirtualClock,
)
from tiergate.sim_nodes.perf import Batching, Deployment

TIMEOUT_S = 10.0


async def collect(stream: RequestStream) -> list[TokenEvent]:
    return [event async for event in stream]


@pytest.fixture
def engine(small_node: Deployment) -> Engine:
    return Engine(small_node, Batching(max_num_seqs=8, max_batched_tokens=2048))


async def test_streams_receive_every_token_in_order(engine: Engine) -> None:
    rt = RealtimeEngine(engine)
    await rt.start()
    try:
        streams = [rt.submit(64, 5), rt.submit(32, 3), rt.submit(16, 1)]
        results = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in streams)), TIMEOUT_S)
    finally:
        await rt.stop()
    for stream, events, want in zip(streams, results, (5, 3, 1), strict=True):
        assert sum(e.tokens for e in events) == want
        assert all(e.tokens >= 1 for e in events)
        assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
        assert events[-1].finish_reason == "length" == stream.finish_reason
        times = [e.time_s for e in events]
        assert times == sorted(times)
        assert stream.first_token_s == times[0]
        assert stream.output_tokens == want
    assert rt.num_streams == 0 and not engine.has_work


async def test_cancel_aborts_and_frees_the_cache(engine: Engine) -> None:
    rt = RealtimeEngine(engine)
    await rt.start()
    try:
        stream = rt.submit(256, 10_000)
        seen = []
        async with asyncio.timeout(TIMEOUT_S):
            async for event in stream:
                seen.append(event)
                if len(seen) == 2:
                    stream.cancel()
        stream.cancel()  # idempotent
    finally:
        await rt.stop()
    assert seen[-1] == TokenEvent(0, seen[-1].time_s, True, "abort")
    assert stream.finish_reason == "abort"
    assert sum(e.tokens for e in seen) >= 2
    assert not engine.has_work and engine.kv_usage == 0.0
    assert rt.num_streams == 0


async def test_stop_ends_pending_streams_with_abort(engine: Engine) -> None:
    rt = RealtimeEngine(engine)
    await rt.start()
    stream = rt.submit(64, 100_000)
    await rt.stop()
    events = await asyncio.wait_for(collect(stream), TIMEOUT_S)
    assert events[-1].finished and events[-1].finish_reason == "abort"
    assert not engine.has_work


async def test_a_step_that_fails_ends_its_streams_and_refuses_later_requests(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step the model cannot compute (an absurd profile) ends the loop: its readers get
    an abort instead of waiting forever, later requests a clear error, the owner one report."""

    def broken(start_s: float) -> None:
        raise ZeroDivisionError("float division by zero")

    reports: list[str] = []
    rt = RealtimeEngine(engine, on_failure=reports.append)
    monkeypatch.setattr(engine, "step", broken)
    await rt.start()
    try:
        stream = rt.submit(64, 5)
        events = await asyncio.wait_for(collect(stream), TIMEOUT_S)
        assert events[-1].finished and events[-1].finish_reason == "abort"
        with pytest.raises(EngineStoppedError, match="ZeroDivisionError: float division by zero"):
            rt.submit(8, 2)
    finally:
        await rt.stop()  # returns: the failure was reported, not raised again
    assert reports == ["ZeroDivisionError: float division by zero"]
    assert rt.failure is not None and rt.num_streams == 0


async def test_submit_before_start_and_capacity_errors(engine: Engine) -> None:
    rt = RealtimeEngine(engine)
    with pytest.raises(EngineCapacityError):
        rt.submit(200_000, 10)
    stream = rt.submit(8, 2, priority=1)
    await rt.start()
    try:
        events = await asyncio.wait_for(collect(stream), TIMEOUT_S)
    finally:
        await rt.stop()
    assert sum(e.tokens for e in events) == 2


async def test_virtual_clock_times_tokens_at_step_ends(engine: Engine) -> None:
    clock = VirtualClock(100.0)
    rt = RealtimeEngine(engine, clock)
    await rt.start()
    try:
        first = rt.submit(128, 4)
        events = await asyncio.wait_for(collect(first), TIMEOUT_S)
        # Idle in between: the next request's first step starts at submission time.
        clock.advance(5.0)
        second = rt.submit(128, 1)
        (only,) = await asyncio.wait_for(collect(second), TIMEOUT_S)
    finally:
        await rt.stop()
    times = [e.time_s for e in events]
    assert times[0] > 100.0 and times == sorted(set(times))
    assert first.finished_s == times[-1]
    assert second.submitted_s == times[-1] + 5.0
    assert only.time_s - second.submitted_s == pytest.approx(times[0] - 100.0)
    assert only.finish_reason == "length" and only.tokens == 1
