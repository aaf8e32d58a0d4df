"""Scheduler decisions, driven step by step without a clock or a performance model."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from tiergate.sim_nodes.engine import BlockAllocator, EngineCapacityError, EngineRequest, Scheduler
from tiergate.sim_nodes.engine.scheduler import ScheduledBatch


def make(
    *,
    blocks: int = 10_000,
    block_size: int = 16,
    max_num_seqs: int | None = 8,
    budget: int = 512,
    chunked: bool = True,
) -> Scheduler:
    return Scheduler(
        BlockAllocator(blocks, block_size),
        max_num_seqs=max_num_seqs,
        max_batched_tokens=budget,
        chunked_prefill=chunked,
    )


def req(
    rid: str, prompt: int = 32, out: int = 4, priority: int = 0, at: float = 0.0
) -> EngineRequest:
    return EngineRequest(rid, prompt, out, priority, at)


Check = Callable[[Scheduler, ScheduledBatch], None]


def run(
    s: Scheduler, check: Check | None = None, limit: int = 100_000
) -> tuple[Counter[str], list[str]]:
    """Run to completion; returns tokens emitted per request and the finish order."""
    emitted: Counter[str] = Counter()
    finished: list[str] = []
    for _ in range(limit):
        if not s.has_work:
            return emitted, finished
        batch = s.schedule()
        if check is not None:
            check(s, batch)
        done = s.complete(batch)
        for seq in batch.decode:
            emitted[seq.request_id] += 1
        for seq in done.prefilled:
            emitted[seq.request_id] += 1
        finished += [seq.request_id for seq in done.finished]
    raise AssertionError("scheduler did not drain")


def test_batch_cap_is_respected_and_everything_completes() -> None:
    s = make(max_num_seqs=4)
    for i in range(10):
        s.add(req(f"r{i}", out=5))
    peak = 0

    def check(s: Scheduler, batch: ScheduledBatch) -> None:
        nonlocal peak
        peak = max(peak, s.num_running)
        assert s.num_running <= 4

    emitted, finished = run(s, check)
    assert peak == 4
    assert sorted(finished) == sorted(f"r{i}" for i in range(10))
    assert all(emitted[f"r{i}"] == 5 for i in range(10))


def test_token_budget_is_respected() -> None:
    s = make(budget=100, max_num_seqs=16)
    for i in range(6):
        s.add(req(f"r{i}", prompt=70, out=3))

    def check(s: Scheduler, batch: ScheduledBatch) -> None:
        assert len(batch.decode) + batch.prefill_tokens <= 100

    emitted, _ = run(s, check)
    assert sum(emitted.values()) == 18


def test_chunked_prefill_splits_a_prompt_across_steps() -> None:
    s = make(budget=100)
    s.add(req("long", prompt=250, out=2))
    chunks = []
    for _ in range(3):
        batch = s.schedule()
        chunks += [(chunk, prefix) for _seq, chunk, prefix in batch.prefills]
        done = s.complete(batch)
    assert chunks == [(100, 0), (100, 100), (50, 200)]
    assert [seq.request_id for seq in done.first_token] == ["long"]


def test_without_chunked_prefill_a_prompt_waits_for_room() -> None:
    s = make(budget=100, chunked=False)
    s.add(req("a", prompt=60))
    s.add(req("b", prompt=60))
    first = s.schedule()
    assert [(seq.request_id, chunk) for seq, chunk, _ in first.prefills] == [("a", 60)]
    s.complete(first)
    second = s.schedule()
    assert [seq.request_id for seq in second.decode] == ["a"]
    assert [(seq.request_id, chunk) for seq, chunk, _ in second.prefills] == [("b", 60)]


def test_with_chunked_prefill_the_rest_of_the_budget_is_used() -> None:
    s = make(budget=100, chunked=True)
    s.add(req("a", prompt=60))
    s.add(req("b", prompt=60))
    first = s.schedule()
    assert [(seq.request_id, chunk) for seq, chunk, _ in first.prefills] == [("a", 60), ("b", 40)]


def test_kv_pressure_preempts_the_latest_and_it_still_completes() -> None:
    # 10 blocks of 4 tokens; each request grows to 12 + 16 = 28 tokens (7 blocks).
    s = make(blocks=10, block_size=4, budget=64)
    s.add(req("early", prompt=12, out=16, at=0.0))
    s.add(req("late", prompt=12, out=16, at=1.0))
    preempted: list[str] = []

    def check(s: Scheduler, batch: ScheduledBatch) -> None:
        preempted.extend(seq.request_id for seq in batch.preempted)
        assert s.blocks.used_blocks <= s.blocks.total_blocks

    emitted, finished = run(s, check)
    assert preempted and set(preempted) == {"late"}
    assert s.num_preemptions == len(preempted)
    assert emitted == Counter({"early": 16, "late": 16})
    assert finished == ["early", "late"]
    assert s.blocks.used_blocks == 0


def test_priority_orders_admission() -> None:
    s = make(max_num_seqs=1)
    s.add(req("background", priority=5))
    s.add(req("urgent", priority=0))
    _, finished = run(s)
    assert finished == ["urgent", "background"]


def test_equal_priorities_are_first_come_first_served() -> None:
    s = make(max_num_seqs=1)
    for i in range(5):
        s.add(req(f"r{i}", at=1.0))
    _, finished = run(s)
    assert finished == [f"r{i}" for i in range(5)]


def test_request_larger_than_the_cache_is_rejected() -> None:
    s = make(blocks=4, block_size=16)
    with pytest.raises(EngineCapacityError, match="needs 80 tokens"):
        s.add(req("big", prompt=60, out=20))


def test_abort_frees_blocks_in_every_state() -> None:
    s = make(budget=64, max_num_seqs=2)
    for rid in ("decoding", "prefilling", "waiting"):
        s.add(req(rid, prompt=100, out=50))
    for _ in range(3):  # decoding: 64 + 36 tokens; prefilling: 28 + 63 of 100
        s.complete(s.schedule())
    assert {seq.status.name for seq in s.running()} == {"DECODING", "PREFILLING"}
    for rid in ("decoding", "prefilling", "waiting"):
        assert s.abort(rid) is not None
        assert s.abort(rid) is None
    assert s.blocks.used_blocks == 0
    assert not s.has_work
    assert s.num_waiting == 0


def test_block_accounting_matches_every_sequence_under_random_load() -> None:
    rng = random.Random(7)
    s = make(blocks=60, block_size=8, budget=96, max_num_seqs=6)
    lengths = {}
    for i in range(40):
        prompt, out = rng.randint(1, 150), rng.randint(1, 120)
        lengths[f"r{i}"] = out
        s.add(req(f"r{i}", prompt=prompt, out=out, priority=rng.randint(0, 2), at=i * 0.1))

    def check(s: Scheduler, batch: ScheduledBatch) -> None:
        # Blocks for this step are allocated at schedule time: one more for crossing decodes.
        held = sum(s.held_blocks(seq) for seq in s.running())
        assert held <= s.blocks.used_blocks <= held + len(batch.decode)
        assert len(batch.decode) + batch.prefill_tokens <= 96

    emitted, finished = run(s, check)
    assert dict(emitted) == lengths
    assert sorted(finished) == sorted(lengths)
    assert s.blocks.used_blocks == 0
