"""A measurements CSV with a bad row: one line naming the file, the line and the field."""

import subprocess
import sys
from pathlib import Path

import pytest

from tiergate.sim_nodes.perf.calibration import (
    MeasurementsError,
    parse_measurements,
    shipped_measurements,
)

PUBLISHED = Path(__file__).with_name("published_measurements.csv")
HEADER = (
    "id,model,accelerator,chips,tensor_parallel,weight_dtype,kv_dtype,concurrency,"
    "input_tokens,output_tokens,metric,value,unit,kind,source"
)
GOOD = "h100-8b-c1,llama-3.1-8b,h100-sxm,1,1,bf16,bf16,1,1024,256,tpot,6.48,ms,independent,src"
FIELDS = HEADER.split(",")


def row(**changes: str) -> str:
    """GOOD with some fields changed (and a new id, so it does not repeat GOOD's)."""
    values = dict(zip(FIELDS, GOOD.split(","), strict=True)) | {"id": "second"} | changes
    return ",".join(values[f] for f in FIELDS)


def problem(bad_row: str) -> str:
    """The error for a file whose second row (line 3) is `bad_row`."""
    with pytest.raises(MeasurementsError) as caught:
        parse_measurements(f"{HEADER}\n{GOOD}\n{bad_row}\n", "bad.csv")
    return str(caught.value)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        (row(value="0"), "value: must be a positive number, got '0'"),
        (row(value="-6.48"), "value: must be a positive number, got '-6.48'"),
        (row(value="nan"), "value: must be a positive number, got 'nan'"),
        (row(value="fast"), "value: must be a positive number, got 'fast'"),
        (row(weight_dtype="fp3"), "weight_dtype: expected one of bf16, fp8, int8, fp4, got 'fp3'"),
        (
            row(metric="tpox"),
            "metric: expected one of tpot, ttft, output_tokens_per_s_per_stream, "
            "throughput_output_tokens_per_s, got 'tpox'",
        ),
        (row(unit="us"), "unit: expected one of ms, s for metric tpot, got 'us'"),
        (row(input_tokens="0"), "input_tokens: expected a whole number >= 1, got '0'"),
        (row(chips="two"), "chips: expected a whole number >= 1 or 'auto', got 'two'"),
        ("second,llama-3.1-8b,h100-sxm,1,1", "weight_dtype: missing (the row has too few fields)"),
        (row() + ",extra", "more fields than the header's 15"),
        (row(id="h100-8b-c1"), "id: 'h100-8b-c1' repeats line 2"),
    ],
)
def test_a_bad_row_is_one_line_naming_file_line_and_field(bad_row: str, message: str) -> None:
    assert problem(bad_row) == f"bad.csv line 3: {message}"


def test_a_missing_column_names_the_header_line() -> None:
    header = HEADER.replace(",value,", ",")
    with pytest.raises(MeasurementsError) as caught:
        parse_measurements(f"{header}\n", "bad.csv")
    assert str(caught.value) == "bad.csv line 1: not a measurements CSV (no column value)"


def test_the_published_and_shipped_files_are_valid() -> None:
    assert len(parse_measurements(PUBLISHED.read_text(encoding="utf-8"))) == 10
    assert len(shipped_measurements()) >= 20


@pytest.mark.slow
def test_the_command_exits_2_with_one_line(tmp_path: Path) -> None:
    csv_file = tmp_path / "bad.csv"
    csv_file.write_text(f"{HEADER}\n{GOOD}\n{row(value='0')}\n", encoding="utf-8")
    cmd = [sys.executable, "-P", "-m", "tiergate", "calibrate", "--no-loo",
           "--measurements", str(csv_file)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"tiergate calibrate: error: {csv_file} line 3: value: must be a positive number, got '0'"
    ]
    assert done.stdout == ""
