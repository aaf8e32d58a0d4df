"""The per-tenant report of a --tenants run on fixed results: shares of tokens served, TTFT
percentiles, 429s apart from other errors, the table and the JSON shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import request_result, run_info

from tiergate.bench.fairness import TenantStats, tenant_stats
from tiergate.bench.report import render_table, write_json
from tiergate.bench.results import RequestResult
from tiergate.bench.stats import BenchReport, summarize

RUN = run_info(
    requests=None, duration_s=10.0, concurrency=5, tenants={"heavy": 4, "light": 1, "idle": 1}
)


def result(tenant: str, **fields: Any) -> RequestResult:
    """A successful batched request of `tenant`: 100 prompt and 50 completion tokens."""
    base = {"e2e_s": 1.0, "prompt_tokens": 100, "completion_tokens": 50, "tenant": tenant}
    return request_result(**(base | fields))


def shed(tenant: str) -> RequestResult:
    return result(tenant, status=429, error="429", ttft_s=None, prompt_tokens=0,
                  completion_tokens=0, retry_after_s=1.0)  # fmt: skip


RESULTS = [
    # heavy: 4 served (600 tokens), 3 shed, 1 timeout; TTFT 100, 200, 300, 400 ms
    *(result("heavy", ttft_s=t) for t in (0.4, 0.1, 0.3, 0.2)),
    *(shed("heavy") for _ in range(3)),
    result("heavy", error="timeout", status=None, ttft_s=None),
    # light: 2 served (300 tokens), one of them on premium; an error that is not a 429
    result("light", ttft_s=0.05),
    result("light", ttft_s=0.15, served_tier="premium", prompt_tokens=120, completion_tokens=30),
    result("light", error="503", status=503, ttft_s=None),
]


def rows() -> dict[str, TenantStats]:
    return {row.tenant: row for row in tenant_stats(RESULTS, RUN.tenants, wall_s=10.0)}


def test_shares_are_of_all_tokens_served() -> None:
    heavy, light, idle = rows().values()
    assert (heavy.prompt_tokens, heavy.completion_tokens, heavy.tokens_served) == (400, 200, 600)
    assert light.tokens_served == 300
    assert heavy.tokens_served_share_pct == pytest.approx(100 * 600 / 900)
    assert light.tokens_served_share_pct == pytest.approx(100 * 300 / 900)
    assert heavy.tokens_served_per_s == pytest.approx(60.0)
    assert idle.requests == 0 and idle.tokens_served == 0 and idle.tokens_served_share_pct == 0
    assert idle.ttft_p50_ms is None and idle.tiers == []


def test_429s_are_counted_apart_from_other_errors() -> None:
    heavy, light, _ = rows().values()
    assert (heavy.requests, heavy.ok, heavy.shed, heavy.errors) == (8, 4, 3, 1)
    assert (light.requests, light.ok, light.shed, light.errors) == (3, 2, 0, 1)


def test_ttft_percentiles_are_of_successful_requests() -> None:
    heavy, light, _ = rows().values()
    assert heavy.ttft_p50_ms == pytest.approx(250.0)
    assert heavy.ttft_p90_ms == pytest.approx(370.0)
    assert light.ttft_p50_ms == pytest.approx(100.0) and light.ttft_p90_ms == pytest.approx(140.0)


def test_tiers_are_those_that_served_the_tenant() -> None:
    heavy, light, _ = rows().values()
    assert heavy.tiers == ["batched"] and light.tiers == ["batched", "premium"]


def test_no_tokens_served_is_no_share() -> None:
    (row,) = tenant_stats([shed("heavy")], {"heavy": 1}, wall_s=0.0)
    assert row.tokens_served_share_pct is None and row.tokens_served_per_s == 0.0


def report() -> BenchReport:
    return summarize(RESULTS, RUN, wall_s=10.0)


def test_the_table_has_a_row_per_tenant_after_the_tier_table() -> None:
    text = render_table(report())
    lines = text.splitlines()
    assert lines[0] == (
        "11 requests (--duration 10s) to http://router in 10.00s (concurrency 5, max_tokens 10)"
    )
    start = lines.index("") + 1
    assert lines[start].startswith("per tenant")
    header = lines[start + 1].split()
    assert header[:6] == ["tenant", "concurrency", "sent", "ok", "429", "errors"]
    heavy = lines[start + 3].split()
    assert heavy[:8] == ["heavy", "4", "8", "4", "3", "1", "600", "66.7%"]
    assert heavy[-3:] == ["250.0", "370.0", "batched"]
    assert lines[start + 4].split()[-1] == "batched,premium"
    assert lines[start + 5].split()[:8] == ["idle", "1", "0", "0", "0", "0", "0", "0.0%"]


def test_a_run_without_tenants_has_no_tenant_table() -> None:
    plain = summarize(RESULTS, RUN.model_copy(update={"tenants": {}}), wall_s=10.0)
    assert plain.tenants == [] and "per tenant" not in render_table(plain)


def test_the_json_has_a_tenants_key(tmp_path: Path) -> None:
    write_json(report(), tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert set(data) == {"run", "wall_s", "tiers", "total", "tenants"}
    assert data["run"]["tenants"] == {"heavy": 4, "light": 1, "idle": 1}
    assert data["run"]["requests"] is None and data["run"]["duration_s"] == 10.0
    assert [row["tenant"] for row in data["tenants"]] == ["heavy", "light", "idle"]
    assert set(data["tenants"][0]) == {
        "tenant", "concurrency", "requests", "ok", "shed", "errors", "prompt_tokens",
        "completion_tokens", "tokens_served", "tokens_served_share_pct", "tokens_served_per_s",
        "ttft_p50_ms", "ttft_p90_ms", "tiers",
    }  # fmt: skip
    assert BenchReport.model_validate(data) == report()
