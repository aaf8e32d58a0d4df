"""Engine: steps priced by the performance model, background load, speculation, capacity."""

from __future__ import annotations

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.engine import (
    Background,
    Engine,
    EngineCapacityError,
    EngineError,
    EngineRequest,
)
from tiergate.sim_nodes.perf import (
    Batching,
    Deployment,
    ServingSpec,
    SpeculativeSpec,
    build_deployment,
    step_terms,
)

BATCHING = Batching(max_num_seqs=64, max_batched_tokens=8192, chunked_prefill=True)


def drain(engine: Engine, start_s: float = 0.0) -> dict[str, int]:
    tokens: dict[str, int] = {}
    now = start_s
    while (outcome := engine.step(now)) is not None:
        for rid, n in outcome.emitted:
            tokens[rid] = tokens.get(rid, 0) + n
        now = outcome.end_s
    return tokens


def test_step_durations_equal_the_perf_model_for_the_same_batch(small_node: Deployment) -> None:
    engine = Engine(small_node, BATCHING)
    for i, prompt in enumerate((100, 300, 50)):
        engine.add(EngineRequest(f"r{i}", prompt, 3))
    prefill = engine.step(10.0)
    assert prefill is not None
    expected = step_terms(
        small_node,
        prefill_tokens=450,
        prefill_attended_positions=sum(p * p / 2.0 for p in (100, 300, 50)),
    )
    assert prefill.start_s == 10.0
    assert prefill.end_s - prefill.start_s == pytest.approx(expected.total_s, rel=1e-12)
    assert prefill.terms == expected
    assert prefill.emitted == (("r0", 1), ("r1", 1), ("r2", 1))
    decode = engine.step(prefill.end_s)
    assert decode is not None
    assert decode.terms == step_terms(small_node, decode_seqs=3, decode_context_tokens=453)
    last = engine.step(decode.end_s)
    assert last is not None
    assert last.terms == step_terms(small_node, decode_seqs=3, decode_context_tokens=456)
    assert sorted(last.finished) == [("r0", "length"), ("r1", "length"), ("r2", "length")]
    assert engine.step(last.end_s) is None
    assert not engine.has_work


def test_background_slows_steps_and_occupies_slots(small_node: Deployment) -> None:
    quiet = Engine(small_node, Batching(12, 8192))
    busy = Engine(small_node, Batching(12, 8192), background=Background(10, 4000))
    assert busy.num_running == busy.background_sequences == 10
    assert busy.kv_usage > 0.0 and quiet.kv_usage == 0.0
    for engine in (quiet, busy):
        for i in range(4):
            engine.add(EngineRequest(f"r{i}", 64, 8))
    quiet_first = quiet.step(0.0)
    busy_first = busy.step(0.0)
    assert quiet_first is not None and busy_first is not None
    assert quiet.num_running == 4
    assert busy.num_running == 12 and busy.num_waiting == 2  # only 2 slots left
    assert busy_first.terms == step_terms(
        small_node,
        decode_seqs=10,
        decode_context_tokens=40_000,
        prefill_tokens=128,
        prefill_attended_positions=2 * 64 * 32.0,
    )
    # The same two prompts' prefill without the background's decoding is quicker. (The quiet
    # engine's first step prefills four prompts, so it is no yardstick.)
    alone = step_terms(small_node, prefill_tokens=128, prefill_attended_positions=2 * 64 * 32.0)
    assert busy_first.end_s > alone.total_s
    assert drain(busy, busy_first.end_s) and busy.num_running == 10  # background stays


def test_background_that_does_not_fit_is_refused(small_node: Deployment) -> None:
    with pytest.raises(EngineCapacityError, match="leave no batch slot"):
        Engine(small_node, Batching(8, 8192), background=Background(8, 100))
    with pytest.raises(EngineCapacityError, match="tokens of KV cache"):
        Engine(small_node, BATCHING, background=Background(50, 100_000))


def test_speculative_decoding_emits_more_tokens_per_step(catalog: Catalog) -> None:
    spec = ServingSpec(
        model="llama-3.1-70b",
        accelerator="h100-sxm",
        speculative_decoding=SpeculativeSpec(
            draft_model="llama-3.1-8b", tokens=4, acceptance_rate=0.8
        ),
    )
    deployment = build_deployment(spec, catalog)
    engine = Engine(deployment, BATCHING, seed=3)
    engine.add(EngineRequest("r", 100, 200))
    per_step = []
    now = 0.0
    total = 0
    while (outcome := engine.step(now)) is not None:
        assert all(n <= 5 for _, n in outcome.emitted)
        total += sum(n for _, n in outcome.emitted)
        per_step += [n for _, n in outcome.emitted]
        now = outcome.end_s
    assert total == 200
    assert sum(per_step) / len(per_step) > 2.0  # (1 - 0.8^5) / 0.2 = 3.36 expected


def test_speculative_draws_are_seeded(catalog: Catalog) -> None:
    spec = ServingSpec(
        model="llama-3.1-70b",
        accelerator="h100-sxm",
        speculative_decoding=SpeculativeSpec(
            draft_model="llama-3.1-8b", tokens=3, acceptance_rate=0.6
        ),
    )
    deployment = build_deployment(spec, catalog)

    def trace(seed: int) -> list[tuple[tuple[str, int], ...]]:
        engine = Engine(deployment, BATCHING, seed=seed)
        for i in range(4):
            engine.add(EngineRequest(f"r{i}", 50, 40))
        out, now = [], 0.0
        while (outcome := engine.step(now)) is not None:
            out.append(outcome.emitted)
            now = outcome.end_s
        return out

    assert trace(1) == trace(1)
    assert trace(1) != trace(2)


def test_abort_frees_blocks(small_node: Deployment) -> None:
    engine = Engine(small_node, BATCHING)
    engine.add(EngineRequest("a", 1000, 500))
    engine.add(EngineRequest("b", 1000, 500))
    now = 0.0
    for _ in range(5):
        outcome = engine.step(now)
        assert outcome is not None
        now = outcome.end_s
    assert engine.kv_usage > 0
    assert engine.abort("a") and engine.abort("b")
    assert not engine.abort("a")
    assert engine.kv_usage == 0.0
    assert not engine.has_work and engine.step(now) is None


def test_requests_that_can_never_run_are_refused(small_node: Deployment) -> None:
    engine = Engine(small_node, BATCHING)
    with pytest.raises(EngineCapacityError, match="context of llama-3.1-8b"):
        engine.add(EngineRequest("long", 130_000, 5_000))
    tight = Engine(small_node, BATCHING, background=Background(4, 100_000))
    with pytest.raises(EngineCapacityError, match="KV cache"):
        tight.add(EngineRequest("big", 100_000, 20_000))
    whole = Engine(small_node, Batching(64, 512, chunked_prefill=False))
    with pytest.raises(EngineCapacityError, match="chunked prefill is off"):
        whole.add(EngineRequest("p", 600, 5))
    engine.add(EngineRequest("dup", 10, 5))
    with pytest.raises(EngineError, match="already"):
        engine.add(EngineRequest("dup", 10, 5))
    with pytest.raises(EngineError, match="at least 1"):
        EngineRequest("zero", 0, 5)


def test_weights_that_do_not_fit_are_refused(catalog: Catalog) -> None:
    spec = ServingSpec(model="llama-3.1-405b", accelerator="h100-sxm", chips=1)
    with pytest.raises(EngineCapacityError, match="do not fit"):
        Engine(build_deployment(spec, catalog), BATCHING)


def test_stats_follow_the_queue(small_node: Deployment) -> None:
    engine = Engine(small_node, Batching(max_num_seqs=2, max_batched_tokens=8192))
    for i in range(5):
        engine.add(EngineRequest(f"r{i}", 20, 3))
    assert engine.num_waiting == 5 and engine.num_running == 0
    first = engine.step(0.0)
    assert first is not None and first.emitted == (("r0", 1), ("r1", 1))
    assert engine.num_running == 2 and engine.num_waiting == 3
    assert drain(engine, first.end_s) == {"r0": 2, "r1": 2, "r2": 3, "r3": 3, "r4": 3}
    assert engine.num_preemptions == 0
