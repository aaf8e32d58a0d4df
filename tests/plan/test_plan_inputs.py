"""Every number and file a plan reads is bounded: inputs that once hung the planner or printed
a traceback are one line on stderr and exit status 2, run as a user runs `tiergate plan`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plan_helpers import plan_cli, tiny_plan, write_plan

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow


def traced(trace: str) -> dict[str, Any]:
    data = tiny_plan()
    data["trace"] = trace
    del data["tiers"]["batched"]["ratePerS"]
    return data


NUMBERS: dict[str, tuple[dict[str, Any], str]] = {
    "rate 1e300": (tiny_plan(ratePerS=1e300), "ratePerS: Input should be less than or equal"),
    "rate 1e308": (tiny_plan(ratePerS=1e308), "ratePerS: Input should be less than or equal"),
    "rate too small": (tiny_plan(ratePerS=1e-300), "ratePerS: Input should be greater"),
    "output 150000": (tiny_plan(outputTokens="150000"), "outputTokens: at most 32768 tokens"),
    "uniform output": (tiny_plan(outputTokens="uniform:1:99999"), "outputTokens: at most"),
    "lognormal sigma": (tiny_plan(outputTokens="lognormal:100:50"), "lognormal sigma at most"),
    "prompt 1e9": (tiny_plan(promptTokens=10**9), "promptTokens: at most"),
    "ttft": (tiny_plan(slo={"ttftMs": 1e12, "tpotMs": 10}), "slo.ttftMs: Input should be"),
}


@pytest.mark.parametrize("data, expected", NUMBERS.values(), ids=NUMBERS.keys())
def test_out_of_range_numbers_are_one_line_and_exit_2(
    tmp_path: Path, data: dict[str, Any], expected: str
) -> None:
    done = plan_cli(write_plan(tmp_path, data))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr


def test_a_step_budget_of_one_token_is_refused(tmp_path: Path) -> None:
    data = tiny_plan()
    data["search"]["maxBatchedTokens"] = 1
    done = plan_cli(write_plan(tmp_path, data))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "search.maxBatchedTokens: Input should be greater than or equal to 256" in done.stderr


def raw_plan(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    return path


FILES: dict[str, tuple[str, str]] = {
    "5,000-digit number": (
        "name: x\ntiers:\n  batched:\n    model: llama-3.1-8b\n    ratePerS: "
        + "9" * 5000
        + "\n    slo: {ttftMs: 100, tpotMs: 10}\n",
        "plan.yaml: not valid YAML: a number has too many digits",
    ),
    "20,000 nested [": ("tiers: " + "[" * 20_000 + "]" * 20_000 + "\n", "nested too deeply"),
}


@pytest.mark.parametrize("text, expected", FILES.values(), ids=FILES.keys())
def test_hostile_plan_files_are_one_line_and_exit_2(
    tmp_path: Path, text: str, expected: str
) -> None:
    done = plan_cli(raw_plan(tmp_path, text))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr


def test_a_deeply_nested_trace_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    done = plan_cli(write_plan(tmp_path, traced("t.jsonl")))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "t.jsonl line 1: nested too deeply to read" in done.stderr


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_trace_that_never_ends_is_refused(tmp_path: Path) -> None:
    done = plan_cli(write_plan(tmp_path, traced("/dev/zero")))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "trace '/dev/zero' is not a regular file" in done.stderr


def test_a_file_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    from tiergate.plan.files import MAX_FILE_BYTES

    path = tmp_path / "t.jsonl"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk, but larger than the cap
    done = plan_cli(write_plan(tmp_path, traced("t.jsonl")))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "is larger than 32 MiB" in done.stderr
