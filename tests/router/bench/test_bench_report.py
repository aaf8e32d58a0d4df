"""The bench against a scripted tiergate router (tiered models, costs, escalations), and
its outputs: the table, the JSON object, the chart, and the CLI's one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from bench_helpers import models_response, small_workload, sse, text_chunks
from cli_status import run_cli

from tiergate.bench import BenchReport, BenchSettings, run_bench
from tiergate.bench.errors import BenchError
from tiergate.bench.report import PLOT_INSTALL_HINT, render_table, write_json, write_plot

#: $ per output token of each tier, and the model each tier serves.
PRICE = {"batched": 1e-6, "premium": 6e-6, "wafer-scale": 3e-6}
MODELS = [
    {"id": "frontier", "object": "model", "tiers": ["batched", "premium"]},
    {"id": "frontier-spark", "object": "model", "tiers": ["wafer-scale"]},
]


def fake_router(request: httpx.Request) -> httpx.Response:
    """Serves each tier at its price; wafer-scale requests escalate to premium."""
    if request.url.path == "/v1/models":
        return models_response(MODELS)
    body = json.loads(request.content)
    tier = request.headers["x-tiergate-tier"]
    expected = "frontier-spark" if tier == "wafer-scale" else "frontier"
    assert body["model"] == expected
    headers = {"content-type": "text/event-stream", "x-tiergate-pool": f"{tier}-pool"}
    if tier == "wafer-scale":
        tier = "premium"
        headers["x-tiergate-escalated"] = "true"
    headers["x-tiergate-tier"] = tier
    tokens = body["max_tokens"]
    return httpx.Response(
        200, content=sse(*text_chunks(tokens, cost_usd=tokens * PRICE[tier])), headers=headers
    )


async def routed_report() -> BenchReport:
    workload = small_workload(mix={"batched": 0.5, "premium": 0.3, "wafer-scale": 0.2})
    settings = BenchSettings(
        url="http://router/v1", requests=50, concurrency=4, workload=workload, api_key="k"
    )
    return await run_bench(settings, transport=httpx.MockTransport(fake_router))


async def test_a_routed_run_reports_cost_escalation_and_pools() -> None:
    report = await routed_report()
    rows = {s.tier: s for s in report.tiers}
    assert report.run.url == "http://router"
    assert report.run.models == {
        "batched": "frontier",
        "premium": "frontier",
        "wafer-scale": "frontier-spark",
    }
    assert rows["batched"].cost_per_million_output_tokens_usd == pytest.approx(1.0)
    assert rows["premium"].cost_per_million_output_tokens_usd == pytest.approx(6.0)
    assert rows["wafer-scale"].requests == 0 and rows["wafer-scale"].escalations > 0
    assert rows["premium"].pools == ["premium-pool", "wafer-scale-pool"]
    assert report.total.requests == 50 and report.total.errors == 0


async def test_the_table_has_a_row_per_tier_and_a_total() -> None:
    text = render_table(await routed_report())
    lines = text.splitlines()
    assert lines[0].startswith("50 requests to http://router in ")
    assert "$/1M out" in lines[1] and "escalations" in lines[1]
    assert [line.split()[0] for line in lines[3:]] == ["batched", "premium", "wafer-scale", "all"]
    assert "6.00" in lines[4]  # premium $/1M


async def test_json_round_trips_through_the_model(tmp_path: Path) -> None:
    report = await routed_report()
    write_json(report, tmp_path / "r.json")
    assert BenchReport.model_validate_json((tmp_path / "r.json").read_text()) == report
    with pytest.raises(BenchError, match="cannot write"):
        write_json(report, tmp_path / "missing" / "r.json")


async def test_the_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "speed-cost.png"
    write_plot(await routed_report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_a_plot_without_cost_data_is_an_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = await routed_report()
    rows = [
        row.model_copy(update={"cost_per_million_output_tokens_usd": None}) for row in report.tiers
    ]
    with pytest.raises(BenchError, match=r"a cost \(the server reported no cost\)"):
        write_plot(report.model_copy(update={"tiers": rows}), tmp_path / "x.png")
    # every request failed: it is not about cost
    unanswered = [row.model_copy(update={"output_tokens_per_s_per_stream_p50": None})
                  for row in report.tiers]  # fmt: skip
    with pytest.raises(BenchError, match=r"a cost \(no request was answered\)"):
        write_plot(report.model_copy(update={"tiers": unanswered}), tmp_path / "x.png")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "bench", *argv)


def test_plot_without_matplotlib_fails_first_with_the_install_hint(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    # Port 9 (discard) is never contacted: the check comes before any request.
    code, out, err = cli(
        capsys, "--router", "http://127.0.0.1:9", "--plot", str(tmp_path / "p.png")
    )
    assert code == 2 and out == ""
    assert err == f"tiergate bench: error: {PLOT_INSTALL_HINT}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mix", "batched=1,turbo=1"], "--mix: unknown tier 'turbo'"),
        (["--mix", "batched=-1"], "must be a finite number >= 0"),
        (["--mix", "premium"], "expected tier=weight"),
        (["--mix", "premium=0"], "add up to 0"),
        (["--router", "localhost:8080"], "expected an http(s) URL"),
        (["--json", "/nonexistent-dir/r.json"], "--json: no such directory"),
        (["--json", "/"], "is a directory"),
        (["--json", "/proc/r.json"], "cannot write"),
        (["--plot", "/tmp"], "is a directory"),
        (["--plot", "/tmp/tiergate-bench-chart"], "name an image file"),
        (["--router", "http://127.0.0.1:99999"], "expected an http(s) URL"),
        (["--router", "http://[::1"], "expected an http(s) URL"),
        (["--router", "http://:8080"], "expected an http(s) URL"),
        (["--requests", "0"], "at least 1"),
        (["--requests", "99999999999999999999"], "--requests: must be at most 10000000,"),
        (["--concurrency", "99999999999999999999"], "--concurrency: must be at most 100000,"),
        (["--tools-fraction", "1.5"], "must be in [0, 1]"),
        (["--timeout", "-1"], "must be a positive number"),
        (["--slo-ttft-ms", "0"], "must be a positive number"),
        (["--slo-tpot-ms", "fast"], "expected a number"),
    ],
)
def test_bad_flags_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = cli(capsys, "--router", "http://127.0.0.1:9", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
