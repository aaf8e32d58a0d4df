"""End to end: `tiergate bench` against real sim nodes served by uvicorn on a real socket.

A sim node is a plain OpenAI-compatible server (no tiergate headers), so every request counts
for the tier it asked for; its model's `quality` sets the tool-call error rate. Each request
carries a seed drawn from --seed, so the counts below are the same on every run. No timing
is asserted.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from cli_status import run_cli
from loopback_ports import refused_url

from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b"
TIERS = ("batched", "premium", "wafer-scale")
REPO = Path(__file__).resolve().parents[3]


def node_config(**overrides: Any) -> NodeConfig:
    """Fast tokens: the 8B model on one wafer-scale chip."""
    serving = ServingSpec(model=MODEL, accelerator="wse-3", batching=BatchingSpec(max_num_seqs=32))
    return NodeConfig(serving=serving, **overrides)


@pytest.fixture(scope="module")
def node_url(served: Callable[[Any], AbstractContextManager[str]]) -> Iterator[str]:
    with served(create_app(node_config())) as url:
        yield url


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "bench", *argv)


def test_a_run_against_a_sim_node(
    node_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "bench.json"
    code, out, err = bench(
        capsys,
        "--router", node_url,
        "--requests", "400",
        "--concurrency", "16",
        "--tools-fraction", "0.6",
        "--input-tokens", "64",
        "--max-tokens", "12",
        "--seed", "3",
        "--json", str(report_path),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(report_path.read_text())

    assert set(data) == {"run", "wall_s", "tiers", "total", "tenants"}
    assert data["tenants"] == [] and data["run"]["tenants"] == {}  # no --tenants
    assert data["run"]["models"] == {t: MODEL for t in ("batched", "premium", "wafer-scale")}
    total = data["total"]
    assert total["requests"] == 400 and total["errors"] == 0
    assert [t["tier"] for t in data["tiers"]] == ["batched", "premium", "wafer-scale"]
    assert sum(t["requests"] for t in data["tiers"]) == 400
    # The default mix is 6:3:1; the draw is seeded.
    shares = [t["requests"] / 400 for t in data["tiers"]]
    assert shares == pytest.approx([0.6, 0.3, 0.1], abs=0.06)
    for row in data["tiers"]:
        assert row["ttft_p50_ms"] > 0 and row["output_tokens_per_s_per_stream_p50"] > 0
        assert row["cost_per_million_output_tokens_usd"] is None  # a sim node bills nothing
        assert row["escalations"] == 0 and row["pools"] == []

    quality = default_catalog().model(MODEL).quality
    assert total["tool_calls"] == pytest.approx(240, abs=30)
    assert total["tool_call_error_rate"] == pytest.approx(1 - quality, abs=0.07)
    text_tokens = (400 - total["tool_calls"]) * 12
    assert total["output_tokens"] > text_tokens  # tool calls add their arguments' tokens

    assert "batched" in out and "wafer-scale" in out and "tool-call err" in out
    assert f"400 requests to {node_url}" in out
    assert "bench: 400/400 requests" in err  # plain progress lines: stderr is not a TTY


def test_the_same_seed_gives_the_same_counts(
    node_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = []
    for name in ("a.json", "b.json"):
        argv = ["--router", node_url + "/v1/", "--requests", "60", "--tools-fraction", "0.5"]
        code, _, err = bench(capsys, *argv, "--max-tokens", "4", "--json", str(tmp_path / name))
        assert code == 0, err
        reports.append(json.loads((tmp_path / name).read_text()))
    keys = ("tier", "requests", "output_tokens", "tool_calls", "tool_call_errors")
    rows = [[{k: row[k] for k in keys} for row in r["tiers"]] for r in reports]
    assert rows[0] == rows[1]


def test_two_tenants_get_a_row_each(
    node_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sim node ignores API keys and shares nothing fairly: this is the report's shape on a
    real socket, not the router's fair share."""
    monkeypatch.setenv("TIERGATE_TEST_HEAVY_KEY", "sk-heavy-from-env")
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  - {name: heavy, apiKeyEnv: TIERGATE_TEST_HEAVY_KEY, concurrency: 6}\n"
        "  - {name: light, apiKey: sk-light-in-file, concurrency: 1}\n"
    )
    report_path = tmp_path / "bench.json"
    code, out, err = bench(
        capsys,
        "--router", node_url,
        "--tenants", str(tenants),
        "--requests", "120",
        "--mix", "premium=1",
        "--tools-fraction", "0",
        "--input-tokens", "64",
        "--max-tokens", "8",
        "--json", str(report_path),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(report_path.read_text())
    assert data["run"]["tenants"] == {"heavy": 6, "light": 1} and data["run"]["concurrency"] == 7
    rows = {row["tenant"]: row for row in data["tenants"]}
    assert list(rows) == ["heavy", "light"]
    assert sum(row["requests"] for row in rows.values()) == 120 == data["total"]["requests"]
    for row in rows.values():
        assert row["requests"] > 0 and row["ok"] == row["requests"]
        assert row["shed"] == 0 and row["errors"] == 0
        assert row["prompt_tokens"] == 64 * row["ok"]  # the node's usage, prompt included
        assert row["tokens_served"] == row["prompt_tokens"] + row["completion_tokens"]
        assert row["ttft_p50_ms"] > 0 and row["tiers"] == ["premium"]
    assert rows["heavy"]["requests"] > rows["light"]["requests"]  # 6 workers against 1
    shares = [row["tokens_served_share_pct"] for row in rows.values()]
    assert sum(shares) == pytest.approx(100.0)

    tenant_table = out.split("per tenant", 1)[1].splitlines()
    assert [line.split()[0] for line in tenant_table[3:]] == ["heavy", "light"]
    assert "sk-" not in out + err


def test_a_timed_run_against_a_sim_node(
    node_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "bench.json"
    code, out, err = bench(
        capsys, "--router", node_url, "--duration", "0.5", "--concurrency", "2",
        "--max-tokens", "4", "--json", str(report_path),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(report_path.read_text())
    assert data["run"]["requests"] is None and data["run"]["duration_s"] == 0.5
    assert data["total"]["requests"] > 0 and data["total"]["errors"] == 0
    assert f"{data['total']['requests']} requests (--duration 0.5s) to {node_url}" in out
    assert "s of 0.5s" in err  # progress in seconds: there is no total of requests


def test_each_request_is_logged_as_a_json_line_with_when_it_was_sent(
    node_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines_path, report_path = tmp_path / "requests.jsonl", tmp_path / "bench.json"
    before = time.time()
    code, _, err = bench(
        capsys, "--router", node_url, "--requests", "30", "--concurrency", "3",
        "--max-tokens", "5", "--slo-ttft-ms", "60000", "--requests-jsonl", str(lines_path),
        "--json", str(report_path),
    )  # fmt: skip
    assert code == 0, err
    lines = [json.loads(line) for line in lines_path.read_text().splitlines()]
    assert sorted(line["index"] for line in lines) == list(range(30))
    for line in lines:
        assert before <= line["sent_at"] <= time.time()
        assert line["status"] == 200 and line["error"] is None and line["ttft_s"] > 0
        assert line["completion_tokens"] >= 1 and line["requested_tier"] in TIERS
    total = json.loads(report_path.read_text())["total"]
    assert total["slo_attainment"] == 1.0  # a minute to the first token: every one met it


def test_failing_requests_are_counted_not_fatal(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    served: Callable[[Any], AbstractContextManager[str]],
) -> None:
    with served(create_app(node_config(failure_rate=0.3, seed=5))) as url:
        code, out, err = bench(
            capsys,
            "--router", url,
            "--requests", "100",
            "--mix", "premium=1",
            "--max-tokens", "4",
            "--json", str(tmp_path / "r.json"),
        )  # fmt: skip
    assert code == 0, err
    row = json.loads((tmp_path / "r.json").read_text())["tiers"][0]
    assert row["tier"] == "premium" and row["requests"] == 100
    assert 10 <= row["errors"] <= 50
    assert set(row["errors_by_kind"]) <= {"500", "503"}
    assert sum(row["errors_by_kind"].values()) == row["errors"]
    assert "errors: premium: 5" in out


def test_an_explicit_unknown_model_is_a_404_per_request(
    node_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = bench(capsys, "--router", node_url, "--requests", "5", "--model", "nope")
    assert code == 1  # every request failed
    assert "errors: " in out and "404 x" in out


def test_a_refused_connection_is_one_line_naming_the_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = refused_url()
    code, out, err = bench(capsys, "--router", url, "--requests", "3")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"tiergate bench: error: cannot connect to {url}")


def test_ctrl_c_prints_and_writes_what_finished(node_url: str, tmp_path: Path) -> None:
    """A long run stopped by SIGINT (Ctrl-C) once some requests are done: the report of those
    is printed and written, marked as interrupted, and the exit status says so."""
    report_path = tmp_path / "partial.json"
    argv = [
        sys.executable, "-P", "-m", "tiergate", "bench", "--router", node_url,
        "--requests", "5000", "--concurrency", "2", "--max-tokens", "40", "--seed", "1",
        "--json", str(report_path),
    ]  # fmt: skip
    bench = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert bench.stderr is not None
        first = bench.stderr.readline()  # the first progress line: 500 requests done
        assert first.startswith("bench: 500/5000 requests"), first
        bench.send_signal(signal.SIGINT)
        out, err = bench.communicate(timeout=60)
    finally:
        bench.kill()
    assert bench.returncode == 130, err
    assert "Traceback" not in err
    data = json.loads(report_path.read_text())
    finished = data["total"]["requests"]
    assert data["run"]["interrupted"] is True and 500 <= finished < 5000
    assert sum(t["requests"] for t in data["tiers"]) == finished
    assert f"{finished} of 5000 requests (interrupted) to {node_url} in " in out
    assert "batched" in out and "tool-call err" in out


def test_ctrl_c_while_it_asks_for_the_models_stops_at_once(tmp_path: Path) -> None:
    """A server that accepts and never answers: Ctrl-C must not wait out --timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        listener.settimeout(60)  # a bench that never connects fails the test, not hangs it
        argv = [sys.executable, "-P", "-m", "tiergate", "bench", "--router", url,
                "--timeout", "600", "--json", str(tmp_path / "r.json")]  # fmt: skip
        bench = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        try:
            conn, _ = listener.accept()  # GET /v1/models has been sent
            bench.send_signal(signal.SIGINT)
            out, err = bench.communicate(timeout=120)  # not 600 s
            conn.close()
        finally:
            bench.kill()
    assert bench.returncode == 130 and out == ""
    assert err == "tiergate bench: interrupted before any request was sent\n"
    assert not (tmp_path / "r.json").exists()  # no report of nothing
