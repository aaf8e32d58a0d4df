"""Virtual-time simulation of replicas, and the workloads that feed it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tiergate.sim_nodes.engine.errors import EngineError
from tiergate.sim_nodes.engine.request import EngineRequest
from tiergate.sim_nodes.engine.simulation import percentile, simulate
from tiergate.sim_nodes.engine.workload import (
    LengthDistribution,
    WorkloadError,
    WorkloadRequest,
    load_trace,
    parse_length,
    poisson_workload,
)
from tiergate.sim_nodes.perf import Batching, Deployment

BATCHING = Batching(max_num_seqs=32, max_batched_tokens=4096)


def workload(n: int, rate: float | None, seed: int = 0) -> list[WorkloadRequest]:
    return poisson_workload(
        n,
        rate,
        parse_length("uniform:200:800"),
        parse_length("lognormal:60:0.5"),
        random.Random(seed),
    )


def test_simulation_is_deterministic_and_completes_everything(small_node: Deployment) -> None:
    a = simulate(small_node, BATCHING, workload(300, 40.0, seed=1), replicas=2, seed=1)
    b = simulate(small_node, BATCHING, workload(300, 40.0, seed=1), replicas=2, seed=1)
    c = simulate(small_node, BATCHING, workload(300, 40.0, seed=2), replicas=2, seed=2)
    assert a == b
    assert a != c
    assert a.completed == a.requests == 300 and a.rejected == 0
    assert 0 < a.ttft_p50_s <= a.ttft_p90_s <= a.ttft_p99_s
    assert 0 < a.tpot_p50_s <= a.tpot_p99_s
    assert a.output_tokens_per_s == pytest.approx(a.output_tokens / a.duration_s)
    assert a.cost_per_million_output_tokens_usd == pytest.approx(
        2 * small_node.cost_per_hour_usd * a.duration_s / 3600 / a.output_tokens * 1e6
    )


def test_more_replicas_lower_ttft_under_load(small_node: Deployment) -> None:
    load = workload(400, 60.0)
    one = simulate(small_node, BATCHING, load, replicas=1)
    four = simulate(small_node, BATCHING, load, replicas=4)
    assert four.ttft_p90_s < one.ttft_p90_s
    assert four.completed == one.completed == 400


def test_goodput_counts_requests_meeting_the_slo(small_node: Deployment) -> None:
    load = workload(200, 60.0)
    loose = simulate(small_node, BATCHING, load, slo_ttft_s=1e6, slo_tpot_s=1e6)
    tight = simulate(small_node, BATCHING, load, slo_ttft_s=1e-6)
    assert loose.goodput_requests_per_s == pytest.approx(loose.requests_per_s)
    assert tight.goodput_requests_per_s == 0.0


def test_kv_pressure_preempts_and_still_completes(small_node: Deployment) -> None:
    # Long outputs on a KV cache that holds ~400k tokens: 64 x 8k tokens do not fit at once.
    load = [WorkloadRequest(0.0, 4000, 4000) for _ in range(128)]
    report = simulate(small_node, Batching(max_num_seqs=128, max_batched_tokens=8192), load)
    assert report.preemptions > 0
    assert report.completed == 128 and report.output_tokens == 128 * 4000


def test_requests_that_never_fit_are_counted_as_rejected(small_node: Deployment) -> None:
    load = [WorkloadRequest(0.0, 10, 10), WorkloadRequest(0.1, 200_000, 10)]
    report = simulate(small_node, BATCHING, load)
    assert report.completed == 1 and report.rejected == 1
    assert report.first_rejection is not None and "context" in report.first_rejection


def test_percentile_interpolates() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0], 100) == 2.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1000", LengthDistribution("fixed", 1000)),
        ("uniform:5:9", LengthDistribution("uniform", 5, 9)),
        ("lognormal:500:0.7", LengthDistribution("lognormal", 500, 0.7)),
    ],
)
def test_length_specs_parse(text: str, expected: LengthDistribution) -> None:
    assert parse_length(text) == expected
    assert str(parse_length(text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "0", "-3", "abc", "uniform:9:5", "uniform:1", "lognormal:0:1", "normal:1:2", "",
        "1000000001", "uniform:1:1000000001", "lognormal:1e308:1", "lognormal:100:1e308",
        "lognormal:nan:1", "lognormal:100:inf", "1" + "0" * 5000,
    ],
)  # fmt: skip
def test_bad_length_specs_are_refused(text: str) -> None:
    with pytest.raises(WorkloadError):
        parse_length(text)


def test_lengths_follow_their_distribution() -> None:
    rng = random.Random(0)
    uniform = [parse_length("uniform:10:20").sample(rng) for _ in range(2000)]
    assert min(uniform) == 10 and max(uniform) == 20
    lognormal = [parse_length("lognormal:300:0.8").sample(rng) for _ in range(20000)]
    assert 270 < sum(lognormal) / len(lognormal) < 330


def test_poisson_arrivals_have_the_requested_rate() -> None:
    load = poisson_workload(5000, 50.0, parse_length("10"), parse_length("10"), random.Random(0))
    assert 4500 / 50.0 < load[-1].arrival_s < 5500 / 50.0
    assert [r.arrival_s for r in load] == sorted(r.arrival_s for r in load)
    at_once = poisson_workload(3, None, parse_length("10"), parse_length("10"), random.Random(0))
    assert {r.arrival_s for r in at_once} == {0.0}


def test_trace_loads_sorted_and_limited(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"arrival_s": 2.0, "prompt_tokens": 10, "output_tokens": 3}\n'
        "\n"
        '{"arrival_s": 1.0, "prompt_tokens": 20, "output_tokens": 4}\n'
        '{"arrival_s": 0.5, "prompt_tokens": 30, "output_tokens": 5}\n'
    )
    assert load_trace(trace) == [
        WorkloadRequest(0.5, 30, 5),
        WorkloadRequest(1.0, 20, 4),
        WorkloadRequest(2.0, 10, 3),
    ]
    assert load_trace(trace, limit=2) == [WorkloadRequest(1.0, 20, 4), WorkloadRequest(2.0, 10, 3)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n{oops\n', "line 2: not JSON"),
        ('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 1}\n', "line 1: prompt_tokens"),
        ('{"arrival_s": 0, "prompt_tokens": 5}\n', "line 1: output_tokens: Field required"),
        (
            '{"arrival_s": 0, "prompt_tokens": 1000000001, "output_tokens": 1}\n',
            "line 1: prompt_tokens: Input should be less than or equal to 1000000000",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 1' + "0" * 5000 + ', "output_tokens": 1}\n',
            "line 1: not JSON",
        ),
        ('{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 1}\n', "line 1: arrival_s"),
        # Past 1e9 s a latency would be lost to the float's step (at 1e15 s, every one read 0).
        (
            '{"arrival_s": 1e15, "prompt_tokens": 5, "output_tokens": 1}\n',
            "line 1: arrival_s: Input should be less than or equal to 1000000000",
        ),
        ("[1, 2]\n", "line 1: record"),
        ("\n\n", "has no requests"),
    ],
)
def test_trace_errors_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(content)
    with pytest.raises(WorkloadError, match=message):
        load_trace(trace)


def test_missing_trace_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="cannot read trace"):
        load_trace(tmp_path / "absent.jsonl")


def test_a_prefix_cache_hit_is_not_prefilled_but_holds_its_kv(small_node: Deployment) -> None:
    cold = [WorkloadRequest(0.0, 6000, 20)]
    warm = [WorkloadRequest(0.0, 6000, 20, cached_prompt_tokens=5400)]
    cold_report = simulate(small_node, BATCHING, cold)
    warm_report = simulate(small_node, BATCHING, warm)
    # 600 new tokens fit one step's budget; 6000 take two chunks.
    assert warm_report.ttft_p50_s < cold_report.ttft_p50_s / 2
    assert warm_report.steps < cold_report.steps
    # The cached prefix still needs its KV blocks: a request longer than the cache is refused.
    too_long = small_node.kv_capacity_tokens + 10
    refused = simulate(
        small_node,
        BATCHING,
        [WorkloadRequest(0.0, 10, 5), WorkloadRequest(0.1, too_long, 5, too_long - 100)],
    )
    assert refused.rejected == 1


def test_a_cached_prefix_must_leave_a_token_to_prefill() -> None:
    with pytest.raises(EngineError, match="cached prompt tokens"):
        EngineRequest("r", 100, 5, cached_prompt_tokens=100)


def test_only_arrivals_within_the_measured_window_are_reported(small_node: Deployment) -> None:
    requests = workload(300, 40.0, seed=4)
    low, high = requests[50].arrival_s, requests[249].arrival_s
    whole = simulate(small_node, BATCHING, requests, replicas=1)
    part = simulate(small_node, BATCHING, requests, replicas=1, measured_s=(low, high))
    assert whole.requests == 300 and part.requests == part.completed == 200
    assert part.output_tokens == sum(r.output_tokens for r in requests[50:250])
    # The first arrivals meet an idle replica, so the measured ones wait longer.
    assert part.ttft_p50_s > simulate(small_node, BATCHING, requests[:50], replicas=1).ttft_p50_s
