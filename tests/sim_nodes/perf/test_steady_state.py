"""Steady-state serving: how TTFT, TPOT, throughput and cost move with the workload."""

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf import Batching, Deployment, PerfConfigError, Workload, evaluate


def d8b(catalog: Catalog) -> Deployment:
    return Deployment(catalog.model("llama-3.1-8b"), catalog.accelerator("h100-sxm"))


def test_more_streams_more_throughput_less_speed_each(catalog: Catalog) -> None:
    results = [evaluate(d8b(catalog), Workload(1024, 256, 0, n)) for n in (1, 8, 64)]
    speeds = [r.output_tokens_per_s_per_stream for r in results]
    throughputs = [r.throughput_output_tokens_per_s for r in results]
    assert speeds == sorted(speeds, reverse=True)
    assert throughputs == sorted(throughputs)


def test_single_stream_tpot_is_the_decode_step(catalog: Catalog) -> None:
    r = evaluate(d8b(catalog), Workload(1024, 256, 0, 1))
    assert r.tpot_s == pytest.approx(r.decode_step.total_s)
    assert r.output_tokens_per_s_per_stream == pytest.approx(1 / r.tpot_s)
    assert r.throughput_output_tokens_per_s == pytest.approx(256 / (r.ttft_s + 255 * r.tpot_s))


def test_cached_prefix_cuts_ttft(catalog: Catalog) -> None:
    cold = evaluate(d8b(catalog), Workload(30000, 100, 0, 1))
    warm = evaluate(d8b(catalog), Workload(30000, 100, 29000, 1))
    assert warm.ttft_s < cold.ttft_s / 10


def test_chunked_prefill_interferes_less_than_whole_prompts(catalog: Catalog) -> None:
    w = Workload(8000, 256, 0, 16)
    chunked = evaluate(d8b(catalog), w, Batching(chunked_prefill=True))
    whole = evaluate(d8b(catalog), w, Batching(chunked_prefill=False))
    assert whole.prefill_interference_s > chunked.prefill_interference_s


def test_max_concurrency_is_kv_limited_and_capped_by_the_batch_cap(catalog: Catalog) -> None:
    d = d8b(catalog)
    r = evaluate(d, Workload(1000, 1000, 0, None))
    assert r.concurrency == r.running_sequences == r.max_concurrency == d.max_concurrency(2000)
    capped = evaluate(d, Workload(1000, 1000, 0, None), Batching(max_num_seqs=32))
    assert capped.running_sequences == 32


def test_concurrency_beyond_the_batch_cap_waits(catalog: Catalog) -> None:
    r = evaluate(d8b(catalog), Workload(1000, 100, 0, 100), Batching(max_num_seqs=10))
    assert r.fits and r.concurrency == 100 and r.running_sequences == 10


def test_too_many_streams_for_the_kv_cache_do_not_fit(catalog: Catalog) -> None:
    r = evaluate(d8b(catalog), Workload(100_000, 1000, 0, 500))
    assert not r.fits
    assert r.reason is not None and "KV cache holds" in r.reason
    assert r.throughput_output_tokens_per_s == 0


def test_weights_that_do_not_fit_explain_the_numbers(catalog: Catalog) -> None:
    d = Deployment(catalog.model("llama-3.1-405b"), catalog.accelerator("a100-40gb"))
    r = evaluate(d, Workload())
    assert not r.fits
    assert r.reason is not None and "GB per chip" in r.reason and "34.0 GB usable" in r.reason


def test_cost_is_price_over_throughput(catalog: Catalog) -> None:
    r = evaluate(d8b(catalog), Workload(1024, 256, 0, 32))
    per_token = r.cost_per_hour_usd / 3600 / r.throughput_output_tokens_per_s
    assert r.cost_per_million_output_tokens_usd == pytest.approx(per_token * 1e6)


def test_longer_than_the_context_is_an_error(catalog: Catalog) -> None:
    with pytest.raises(PerfConfigError, match="exceed the 131072-token context"):
        evaluate(d8b(catalog), Workload(131_000, 1000))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"input_tokens": 0},
        {"output_tokens": -1},
        {"cached_input_tokens": 2000, "input_tokens": 1000},
        {"concurrency": 0},
    ],
)
def test_impossible_workloads_are_errors(kwargs: dict[str, int]) -> None:
    with pytest.raises(PerfConfigError):
        Workload(**kwargs)
