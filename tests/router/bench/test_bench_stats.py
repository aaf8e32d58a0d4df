"""Aggregating request results into per-tier figures (pure)."""

from __future__ import annotations

import pytest
from bench_helpers import request_result, run_info

from tiergate.bench.report import render_table
from tiergate.bench.stats import (
    SloTargets,
    percentile,
    summarize,
    tokens_per_s_per_stream,
)

RUN = run_info()
result = request_result


def test_percentile_interpolates_linearly() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(v) for v in range(1, 101)], 95) == pytest.approx(95.05)
    assert percentile([1.0, 2.0], 0) == 1.0 and percentile([1.0, 2.0], 100) == 2.0


def test_per_stream_speed_excludes_the_first_token() -> None:
    assert tokens_per_s_per_stream(result()) == pytest.approx(10.0)  # 10 tokens in 1 s
    assert tokens_per_s_per_stream(result(completion_tokens=1)) is None
    assert tokens_per_s_per_stream(result(ttft_s=None)) is None
    assert tokens_per_s_per_stream(result(e2e_s=0.1)) is None


def test_rows_are_per_served_tier_in_tier_order() -> None:
    results = [
        result("wafer-scale"),
        result("batched"),
        result("premium", served_tier="batched"),  # served elsewhere: counts where served
    ]
    report = summarize(results, RUN, wall_s=2.0)
    assert [s.tier for s in report.tiers] == ["batched", "wafer-scale"]
    assert report.tiers[0].requests == 2
    assert report.total.requests == 3 and report.total.tier == "all"


def test_latency_speed_and_throughput() -> None:
    results = [
        result(ttft_s=0.1, e2e_s=1.1, completion_tokens=11),
        result(ttft_s=0.3, e2e_s=0.8, completion_tokens=11),  # 20 tok/s
    ]
    row = summarize(results, RUN, wall_s=2.0).tiers[0]
    assert row.ttft_p50_ms == pytest.approx(200.0)
    assert row.ttft_p95_ms == pytest.approx(290.0)
    assert row.output_tokens_per_s_per_stream_p50 == pytest.approx(15.0)
    assert row.output_tokens == 22
    assert row.throughput_output_tokens_per_s == pytest.approx(11.0)


def test_errors_are_counted_by_kind_and_left_out_of_latency() -> None:
    results = [
        result(),
        result(error="503", status=503, error_message="no capacity", ttft_s=None),
        result(error="503", status=503, error_message="later", ttft_s=None),
        result(error="stream", ttft_s=9.0, completion_tokens=4),
        result(error="timeout", status=None),
    ]
    row = summarize(results, RUN, wall_s=1.0).tiers[0]
    assert row.requests == 5 and row.errors == 4
    assert row.errors_by_kind == {"503": 2, "stream": 1, "timeout": 1}
    assert row.error_examples["503"] == "no capacity"
    assert row.ttft_p95_ms == pytest.approx(100.0)  # only the successful request
    assert row.output_tokens == 11


def test_cost_per_million_uses_only_requests_that_report_a_cost() -> None:
    results = [
        result(completion_tokens=1000, cost_usd=0.002),
        result(completion_tokens=3000, cost_usd=0.006),
        result(completion_tokens=5000, cost_usd=None),
    ]
    row = summarize(results, RUN, wall_s=1.0).tiers[0]
    assert row.cost_usd == pytest.approx(0.008)
    assert row.cost_per_million_output_tokens_usd == pytest.approx(2.0)
    no_cost = summarize([result()], RUN, wall_s=1.0).tiers[0]
    assert no_cost.cost_usd is None and no_cost.cost_per_million_output_tokens_usd is None


def test_tool_call_error_rate_counts_successful_tool_requests() -> None:
    results = [
        result(tool_call_expected=True, tool_call_valid=True),
        result(tool_call_expected=True, tool_call_valid=False),
        result(tool_call_expected=True, tool_call_valid=False),
        result(tool_call_expected=True, tool_call_valid=None, error="500"),
        result(),
    ]
    row = summarize(results, RUN, wall_s=1.0).tiers[0]
    assert (row.tool_calls, row.tool_call_errors) == (3, 2)
    assert row.tool_call_error_rate == pytest.approx(2 / 3)
    assert summarize([result()], RUN, wall_s=1.0).tiers[0].tool_call_error_rate is None


def test_escalations_count_for_the_requested_tier() -> None:
    results = [
        result("wafer-scale", served_tier="premium", escalated=True),
        result("wafer-scale", served_tier="premium", escalated=True),
        result("premium"),
    ]
    report = summarize(results, RUN, wall_s=1.0)
    rows = {s.tier: s for s in report.tiers}
    assert list(rows) == ["premium", "wafer-scale"]
    assert rows["premium"].requests == 3 and rows["premium"].escalations == 0
    assert rows["wafer-scale"].requests == 0 and rows["wafer-scale"].escalations == 2
    assert report.total.escalations == 2


def test_pools_are_listed() -> None:
    results = [result(pool="b-1"), result(pool="b-0"), result(pool="b-1"), result()]
    assert summarize(results, RUN, wall_s=1.0).tiers[0].pools == ["b-0", "b-1"]


def test_an_empty_run_reports_nothing_without_failing() -> None:
    report = summarize([], RUN, wall_s=0.0)
    assert report.tiers == [] and report.total.requests == 0
    assert report.total.throughput_output_tokens_per_s == 0.0


def test_slo_attainment_counts_requests_within_every_target_and_failures_as_misses() -> None:
    results = [
        result(ttft_s=0.1, e2e_s=1.1, completion_tokens=11),  # TTFT 100 ms, TPOT 100 ms
        result(ttft_s=0.5, e2e_s=1.5, completion_tokens=11),  # TTFT 500 ms: misses TTFT
        result(ttft_s=0.1, e2e_s=3.1, completion_tokens=11),  # TPOT 300 ms: misses TPOT
        result(error="503", status=503, ttft_s=None, e2e_s=None),  # failed: a miss
        result(ttft_s=0.2, e2e_s=0.2, completion_tokens=1),  # one token: no TPOT to miss
    ]
    both = run_info(slo=SloTargets(ttft_ms=300, tpot_ms=150))
    assert summarize(results, both, wall_s=1.0).tiers[0].slo_attainment == pytest.approx(2 / 5)
    ttft_only = run_info(slo=SloTargets(ttft_ms=300))
    assert summarize(results, ttft_only, wall_s=1.0).total.slo_attainment == pytest.approx(3 / 5)
    assert summarize(results, RUN, wall_s=1.0).tiers[0].slo_attainment is None


def test_the_table_names_the_targets_only_when_given() -> None:
    results = [result(), result("premium", ttft_s=0.9)]
    table = render_table(summarize(results, run_info(slo=SloTargets(ttft_ms=500)), 1.0))
    header, *rows = table.splitlines()[1:]
    assert "SLO met (TTFT <= 500 ms)" in header
    assert rows[-1].rstrip().endswith("50.0%")  # the total: one of two
    assert "SLO met" not in render_table(summarize(results, RUN, 1.0))
