"""`tiergate simulate` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_status import exit_status

from tiergate.cli import main

BASE = ["simulate", "--model", "llama-3.1-8b", "--accelerator", "h100-sxm"]


def test_json_output_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            *BASE,
            "--requests",
            "50",
            "--rate",
            "20",
            "--replicas",
            "2",
            "--prompt-tokens",
            "uniform:100:400",
            "--output-tokens",
            "32",
            "--max-num-seqs",
            "16",
            "--slo-ttft-ms",
            "500",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert report["requests"] == report["completed"] == 50
    assert report["replicas"] == 2 and report["max_num_seqs"] == 16
    assert report["slo_ttft_s"] == 0.5
    assert report["output_tokens"] == 50 * 32


def test_human_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"arrival_s": i * 0.1, "prompt_tokens": 100, "output_tokens": 8}) + "\n"
            for i in range(10)
        )
    )
    assert main([*BASE, "--trace", str(trace), "--no-chunked-prefill"]) == 0
    out = capsys.readouterr().out
    assert "10 requests: 10 completed" in out
    assert "time to first token (ms)" in out and "whole prefill" in out


def test_a_shorter_context_served_lets_fewer_chips_run(capsys: pytest.CaptureFixture[str]) -> None:
    # Qwen3-32B on one H100 cannot hold one sequence of its 40,960-token context (below), but
    # serves a 16,384-token one.
    argv = ["simulate", "--model", "qwen3-32b", "--accelerator", "h100-sxm", "--chips", "1",
            "--max-context-tokens", "16384", "--requests", "20", "--rate", "5",
            "--prompt-tokens", "1000", "--output-tokens", "64", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] == 20 and report["chips"] == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt-tokens", "uniform:9:1"], "uniform needs"),
        (["--output-tokens", "lots"], "bad length"),
        (["--rate", "0"], "positive number"),
        (["--rate", "1e-308"], "rate must be from 0.001 to 1,000,000 arrivals per second"),
        (["--rate", "2e6"], "rate must be from 0.001 to 1,000,000 arrivals per second"),
        (["--rate", "1", "--trace", "x.jsonl"], "not allowed with"),
        (["--trace", "/does/not/exist.jsonl"], "cannot read trace"),
        (["--prompt-tokens", "200000"], "context of llama-3.1-8b"),
        (["--replicas", "0"], "at least 1"),
        (["--replicas", "99999999999999999"], "--replicas: must be at most 10000,"),
        (["--requests", "99999999999999999999"], "--requests: must be at most 1000000,"),
        (["--prompt-tokens", "lognormal:1e308:1"], "--prompt-tokens: lognormal needs"),
        (["--output-tokens", "lognormal:100:1e308"], "--output-tokens: lognormal needs"),
        (["--output-tokens", "2000000000"], "--output-tokens: token count must be in"),
        (["--chips", "1", "--model", "llama-3.1-405b"], "does not fit"),
        # Weights fit, but not one sequence of its 40,960-token context: vLLM would not start.
        (["--chips", "1", "--model", "qwen3-32b"], "less than one sequence of the 40,960-token"),
        (["--max-context-tokens", "200000"], "maxContextTokens 200000 is more than"),
        (["--model", "no-such-model"], "unknown model"),
        (["--max-batched-tokens", "512", "--no-chunked-prefill"], "chunked prefill is off"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert exit_status([*BASE, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
