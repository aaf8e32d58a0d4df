"""The `tiergate` command line: machine output, human output and one-line errors."""

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from cli_status import run_cli

from tiergate.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]

REQUIRED_JSON = {
    "fits",
    "chips",
    "concurrency",
    "max_concurrency",
    "ttft_s",
    "tpot_s",
    "output_tokens_per_s_per_stream",
    "throughput_output_tokens_per_s",
    "cost_per_million_output_tokens_usd",
    "decode_step",
}


run = run_cli


def test_perf_json_is_one_object_with_the_contract_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys, "perf", "--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert REQUIRED_JSON <= set(data)
    assert data["fits"] is True and data["chips"] == 1
    assert data["output_tokens_per_s_per_stream"] == pytest.approx(1 / data["tpot_s"])
    assert {"weight_read_s", "kv_read_s", "overhead_s", "bound"} <= set(data["decode_step"])


def test_perf_table_explains_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "perf", "--model", "llama-3.1-70b", "--accelerator", "h100-sxm", "--chips", "4"
    )
    assert code == 0
    assert "tensor-parallel comm" in out and "weight read" in out and "fits: yes" in out


def test_perf_max_concurrency_and_auto_chips(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "perf",
        "--model", "llama-3.1-70b",
        "--accelerator", "wse-3",
        "--concurrency", "max",
        "--json",
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["chips"] == 4 and data["concurrency"] == data["max_concurrency"] >= 1


def test_a_configuration_that_does_not_fit_is_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys,
        "perf",
        "--model", "llama-3.1-405b",
        "--accelerator", "h100-sxm",
        "--chips", "1",
        "--json",
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["fits"] is False and "GB per chip" in data["reason"]


def test_a_gpu_layout_that_cannot_hold_one_whole_context_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Qwen3-32B on one H100: the weights fit, its KV cache holds fewer tokens than one
    # sequence of the 40,960-token context, which vLLM checks when it starts.
    base = ["perf", "--model", "qwen3-32b", "--accelerator", "h100-sxm", "--chips", "1"]
    code, out, _ = run(capsys, *base, "--json")
    data = json.loads(out)
    assert code == 0 and data["fits"] is False
    assert "less than one sequence of the 40,960-token context" in data["reason"]
    assert "--kv-dtype fp8" in data["reason"] and "--max-context-tokens" in data["reason"]
    # No figures a script could rank a layout vLLM would not start by.
    assert data["throughput_output_tokens_per_s"] == data["ttft_s"] == 0
    # Served with a shorter context, or sized by `auto`, it fits.
    code, out, _ = run(capsys, *base, "--max-context-tokens", "16384", "--json")
    assert code == 0 and json.loads(out)["fits"] is True
    code, out, _ = run(capsys, *base[:-2], "--json")
    assert code == 0 and json.loads(out)["fits"] is True and json.loads(out)["chips"] == 2


def test_speculative_decoding_flags(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["perf", "--model", "llama-3.1-70b", "--accelerator", "h100-sxm", "--json"]
    code, out, _ = run(
        capsys,
        *base,
        "--speculative-tokens", "4",
        "--acceptance-rate", "0.7",
        "--draft-model", "llama-3.1-8b",
    )  # fmt: skip
    assert code == 0 and json.loads(out)["tokens_per_step_per_sequence"] > 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "gpt-9", "--accelerator", "h100-sxm"], "unknown model 'gpt-9'; choose one of"),
        (["--model", "llama-3.1-8b", "--accelerator", "tpu"], "unknown accelerator 'tpu'"),
        (["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--chips", "0"], "at least 1"),
        (["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--chips", "-2"], "at least 1"),
        (
            ["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--chips", "6",
             "--tensor-parallel", "6"],
            "must divide the 32 attention heads",
        ),
        (["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--weight-dtype", "fp3"],
         "invalid choice: 'fp3'"),
        (["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--input-tokens", "x"],
         "expected a whole number"),
        (["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--concurrency", "lots"],
         "or 'max'"),
        (["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--acceptance-rate", "0.5"],
         "speculative decoding needs"),
        (["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--input-tokens", "200000"],
         "exceed the 131072-token context"),
        (["--accelerator", "h100-sxm"], "required: --model"),
        (["--model", "qwen3-32b", "--accelerator", "h100-sxm", "--max-context-tokens", "50000"],
         "maxContextTokens 50000 is more than the 40960-token context"),
        (["--model", "qwen3-32b", "--accelerator", "h100-sxm", "--max-context-tokens", "0"],
         "must be at least 1, got 0"),
        (["--model", "qwen3-32b", "--accelerator", "h100-sxm", "--max-context-tokens", "4096",
          "--input-tokens", "5000"], "exceed the 4096-token context"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "perf", *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.slow  # a fit per row: tens of seconds until the fits are on disk
def test_calibrate_reports_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "calibrate")
    assert code == 0
    assert "wse3-70b-c1" in out and ": ok" in out


def test_calibrate_bad_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "m.csv"
    f.write_text("a,b\n1,2\n")
    code, _, err = run(capsys, "calibrate", "--measurements", str(f))
    assert code == 2 and err.count("\n") == 1 and "not a measurements CSV" in err


@pytest.mark.parametrize("header_only", [False, True])
def test_calibrate_without_rows_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, header_only: bool
) -> None:
    shipped = resources.files("tiergate.sim_nodes.catalogs").joinpath("measurements.csv")
    header = shipped.read_text(encoding="utf-8").splitlines()[0] + "\n"
    f = tmp_path / "m.csv"
    f.write_text(header if header_only else "")
    code, _, err = run(capsys, "calibrate", "--measurements", str(f))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_seeds_prints_the_three_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "seeds")
    assert code == 0
    for tier in ("batched", "premium", "wafer-scale"):
        assert tier in out
    code, out, _ = run(capsys, "seeds", "--json")
    seeds = json.loads(out)
    assert set(seeds) == {"batched", "premium", "wafer-scale"}


def test_seeds_hint_reproduces_the_batched_row(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "seeds", "--json")
    batched = json.loads(out)["batched"]
    _, out, _ = run(capsys, "seeds")
    hint = out.split("Why: `", 1)[1].split("`", 1)[0].split()
    assert hint[0] == "tiergate"
    code, out, _ = run(capsys, *hint[1:], "--json")
    assert code == 0
    assert json.loads(out)["tpot_s"] == pytest.approx(batched["tpot_s"])


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys)
    assert code == 2 and all(name in out for name in COMMANDS)


def test_every_package_directory_is_in_the_distribution() -> None:
    """A subpackage missing from pyproject's list would vanish from a non-editable install."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    found = set()
    for package, folder in config["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == declared


@pytest.mark.parametrize("command", ["up", "router"])
@pytest.mark.parametrize(
    ("pool", "sentence"),
    [
        ("tier: premium, accelerator: h100-sxm, batching: {maxNumSeqs: 256}",
         "premium pools serve a small batch: set spec.batching.maxNumSeqs to 16 or less"),
        ("tier: wafer-scale, accelerator: h100-sxm, batching: {maxNumSeqs: 8}",
         "wafer-scale pools need an SRAM accelerator"),
    ],
)  # fmt: skip
def test_a_pool_file_breaking_its_tier_s_rule_is_refused_as_kubectl_apply_refuses_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, pool: str, sentence: str
) -> None:
    """The same sentence as the CRD's CEL rule (tests/operator/test_crd.py holds the two to the
    same cases), one line, exit status 2, before anything starts."""
    config = tmp_path / "pools.yaml"
    config.write_text(f"pools:\n  - {{name: p, model: llama-3.1-8b, {pool}}}\n")
    code, out, err = run(capsys, command, "--config", str(config), "--port", "1")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and sentence in err and "pools.0" in err, err


PERF = ["perf", "--model", "llama-3.1-8b", "--accelerator", "h100-sxm"]


@pytest.mark.slow
def test_a_reader_that_leaves_stops_the_command_quietly_as_sigpipe_would() -> None:
    """`tiergate perf ... | head -1`: the reader is gone before the command writes."""
    process = subprocess.Popen(
        [sys.executable, "-P", "-m", "tiergate", *PERF],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # long before the import is done and anything is written
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(60) == 141 and stderr == "", stderr


@pytest.mark.slow
def test_output_to_a_full_disk_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        argv = [sys.executable, "-P", "-m", "tiergate", *PERF]
        done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == ["tiergate perf: error: No space left on device"]
