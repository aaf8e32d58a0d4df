"""One replica's capacity at an SLO: the largest concurrency that meets it, by brute force."""

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf import (
    Batching,
    Deployment,
    Resident,
    Workload,
    evaluate,
    slo_capacity,
)

SHAPE = Workload(1024, 256, 0, None)


def d8b(catalog: Catalog) -> Deployment:
    return Deployment(catalog.model("llama-3.1-8b"), catalog.accelerator("h100-sxm"))


def brute_force(d: Deployment, batching: Batching, ttft_s: float, tpot_s: float) -> int:
    best = 0
    for c in range(1, (batching.max_num_seqs or 0) + 1):
        r = evaluate(d, Workload(SHAPE.input_tokens, SHAPE.output_tokens, 0, c), batching)
        if r.fits and r.ttft_s <= ttft_s and r.tpot_s <= tpot_s:
            best = c
    return best


@pytest.mark.parametrize(("ttft_s", "tpot_s"), [(0.2, 0.012), (0.5, 0.02), (1.0, 0.05)])
def test_the_bisection_agrees_with_brute_force(
    catalog: Catalog, ttft_s: float, tpot_s: float
) -> None:
    batching = Batching(max_num_seqs=96)
    found = slo_capacity(d8b(catalog), SHAPE, batching, ttft_s, tpot_s)
    assert found.concurrency == brute_force(d8b(catalog), batching, ttft_s, tpot_s)
    assert found.concurrency > 0 and found.at_capacity is not None
    assert found.at_capacity.concurrency == found.concurrency
    assert found.requests_per_s == pytest.approx(
        found.at_capacity.throughput_output_tokens_per_s / SHAPE.output_tokens
    )


def test_no_targets_is_as_many_streams_as_fit(catalog: Catalog) -> None:
    found = slo_capacity(d8b(catalog), SHAPE, Batching(max_num_seqs=32), None, None)
    assert found.concurrency == 32


def test_too_slow_at_batch_1_has_no_capacity_but_says_its_best(catalog: Catalog) -> None:
    found = slo_capacity(d8b(catalog), SHAPE, Batching(max_num_seqs=32), None, 0.0001)
    assert found.concurrency == 0 and found.at_capacity is None and found.requests_per_s == 0
    assert found.alone.fits and found.alone.tpot_s > 0.0001


def test_a_model_that_does_not_fit_has_no_capacity(catalog: Catalog) -> None:
    d = Deployment(catalog.model("llama-3.1-405b"), catalog.accelerator("a100-40gb"))
    found = slo_capacity(d, SHAPE, Batching(), 1.0, 1.0)
    assert not found.alone.fits and found.concurrency == 0


def test_resident_sequences_take_slots_and_count_in_every_step(catalog: Catalog) -> None:
    batching = Batching(max_num_seqs=32)
    resident = Resident(sequences=8, context_tokens=SHAPE.tokens_per_sequence)
    free = slo_capacity(d8b(catalog), SHAPE, batching, None, None, resident)
    assert free.concurrency == free.room == 24
    found = slo_capacity(d8b(catalog), SHAPE, batching, 0.5, 0.02, resident)
    # Brute force: the requests plus the resident sequences are the batch the SLO sees.
    assert found.concurrency == brute_force(d8b(catalog), batching, 0.5, 0.02) - 8
    assert found.at_capacity is not None
    assert found.at_capacity.concurrency == found.concurrency + 8
    assert found.requests_per_s == pytest.approx(
        found.at_capacity.throughput_output_tokens_per_s
        * found.concurrency
        / (found.concurrency + 8)
        / SHAPE.output_tokens
    )
