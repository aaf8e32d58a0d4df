"""Profiles are bounded so the performance model's arithmetic cannot overflow: every field of
an inline model or accelerator profile at either end of its range gives finite figures or one
line saying why not, through `tiergate perf` as a user runs it; past a bound, one line naming
the field."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from cli_status import exit_status
from pydantic import BaseModel

from tiergate.sim_nodes.catalogs import Accelerator, ModelProfile, default_catalog

CATALOG = default_catalog()


def _profile(profile: BaseModel, name: str) -> dict[str, Any]:
    wire = profile.model_dump(by_alias=True, exclude_none=True)
    wire.pop("kind", None)
    wire.pop("fittedAlone", None)
    return {**wire, "name": name}


MODEL = _profile(CATALOG.model("llama-3.1-8b"), "m")
ACCELERATOR = _profile(CATALOG.accelerator("h100-sxm"), "a")


def _ends(schema: type[BaseModel], wire: dict[str, Any]) -> list[tuple[str, Any]]:
    """(field, value) at the low and the high end of every bounded field in `wire`."""
    ends: list[tuple[str, Any]] = []
    for name, field in schema.model_fields.items():
        alias = field.alias or name
        if alias not in wire or not isinstance(wire[alias], int | float):
            continue
        for rule in field.metadata:
            for kind in ("gt", "ge", "le"):
                bound = getattr(rule, kind, None)
                if bound is None:
                    continue
                value = bound
                if kind == "gt":  # the smallest value above it of the field's type
                    value = bound + 1 if isinstance(wire[alias], int) else bound + 1e-9
                ends.append((alias, value))
    return ends


CASES = [
    *(("model", f, v) for f, v in _ends(ModelProfile, MODEL)),
    *(("accelerator", f, v) for f, v in _ends(Accelerator, ACCELERATOR)),
    ("accelerator", "peakTflops", {"bf16": 1e-9}),
    ("accelerator", "peakTflops", {"bf16": 100_000_000}),
]


def _perf(capsys: pytest.CaptureFixture[str], model: dict[str, Any], acc: dict[str, Any]) -> Any:
    argv = ["perf", "--model", "m", "--accelerator", "a", "--json",
            "--model-profile-json", json.dumps(model),
            "--accelerator-profile-json", json.dumps(acc)]  # fmt: skip
    return exit_status(argv), capsys.readouterr()


@pytest.mark.parametrize(("which", "field", "value"), CASES, ids=lambda x: str(x))
def test_a_field_at_either_end_of_its_range_predicts_or_says_why_in_one_line(
    capsys: pytest.CaptureFixture[str], which: str, field: str, value: Any
) -> None:
    model, acc = dict(MODEL), dict(ACCELERATOR)
    (model if which == "model" else acc)[field] = value
    status, out = _perf(capsys, model, acc)
    if status == 0:
        figures = json.loads(out.out)
        numbers = [v for v in figures.values() if isinstance(v, int | float)]
        assert numbers and all(math.isfinite(v) for v in numbers), figures
    else:
        assert status == 2 and len(out.err.splitlines()) == 1, out.err


@pytest.mark.parametrize(
    ("which", "field", "value", "words"),
    [
        ("accelerator", "peakTflops", {"bf16": 0}, "peakTflops.bf16: Input should be greater"),
        ("accelerator", "memoryGb", 1e300, "memoryGb: Input should be less than or equal"),
        ("accelerator", "interconnectGbPerS", 1e-300, "interconnectGbPerS: Input should be"),
        ("model", "hiddenSize", 10**23, "hiddenSize: Input should be less than or equal"),
        ("model", "vocabSize", 10**8, "no parameters left to compute with"),
    ],
)  # fmt: skip
def test_a_field_past_any_chip_or_model_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], which: str, field: str, value: Any, words: str
) -> None:
    model, acc = dict(MODEL), dict(ACCELERATOR)
    (model if which == "model" else acc)[field] = value
    status, out = _perf(capsys, model, acc)
    assert status == 2 and len(out.err.splitlines()) == 1 and words in out.err, out.err
