"""Published measurements, and how far the model's predictions are from them.

The rows live in ``catalogs/measurements.csv`` (a copy of shared/calibration/measurements.csv).
Every row runs through the same model and the same accelerator parameters: nothing here is
special-cased per row. `tiergate calibrate` prints the table; a test holds it to the bounds.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass
from importlib import resources

from ..catalogs import Catalog, Dtype
from .deployment import Deployment, chips_to_hold
from .steady_state import PerfResult, Workload, evaluate

#: A prediction further than this from its measurement fails calibration.
MAX_ERROR = 0.30
#: The median error over all rows must stay below this.
MAX_MEDIAN_ERROR = 0.12


@dataclass(frozen=True, slots=True)
class Measurement:
    id: str
    model: str
    accelerator: str
    chips: str
    tensor_parallel: int
    weight_dtype: Dtype
    kv_dtype: Dtype
    concurrency: str
    input_tokens: int
    output_tokens: int
    metric: str
    value: float
    unit: str
    source: str


@dataclass(frozen=True, slots=True)
class Comparison:
    measurement: Measurement
    predicted: float
    result: PerfResult

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return (self.predicted - self.measurement.value) / self.measurement.value


def parse_measurements(text: str) -> list[Measurement]:
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        rows.append(
            Measurement(
                id=r["id"],
                model=r["model"],
                accelerator=r["accelerator"],
                chips=r["chips"],
                tensor_parallel=int(r["tensor_parallel"]),
                weight_dtype=r["weight_dtype"],  # type: ignore[arg-type]
                kv_dtype=r["kv_dtype"],  # type: ignore[arg-type]
                concurrency=r["concurrency"],
                input_tokens=int(r["input_tokens"]),
                output_tokens=int(r["output_tokens"]),
                metric=r["metric"],
                value=float(r["value"]),
                unit=r["unit"],
                source=r["source"],
            )
        )
    return rows


def shipped_measurements() -> list[Measurement]:
    pkg = resources.files(__package__.rsplit(".", 1)[0] + ".catalogs")
    return parse_measurements(pkg.joinpath("measurements.csv").read_text(encoding="utf-8"))


def predict(row: Measurement, catalog: Catalog) -> Comparison:
    """Run one measurement's configuration through the model."""
    model = catalog.model(row.model)
    accelerator = catalog.accelerator(row.accelerator)
    concurrency = None if row.concurrency == "max" else int(row.concurrency)
    workload = Workload(row.input_tokens, row.output_tokens, 0, concurrency)
    if row.chips == "auto":
        kv_tokens = (concurrency or 1) * workload.tokens_per_sequence
        chips = chips_to_hold(
            model,
            accelerator,
            weight_dtype=row.weight_dtype,
            kv_dtype=row.kv_dtype,
            kv_tokens=kv_tokens,
        )
    else:
        chips = int(row.chips)
    deployment = Deployment(
        model, accelerator, chips, row.tensor_parallel, row.weight_dtype, row.kv_dtype
    )
    result = evaluate(deployment, workload)
    return Comparison(row, _metric(result, row.metric, row.unit), result)


def _metric(result: PerfResult, metric: str, unit: str) -> float:
    value = float(getattr(result, {"tpot": "tpot_s", "ttft": "ttft_s"}.get(metric, metric)))
    return value * 1000.0 if unit == "ms" else value


def compare_all(catalog: Catalog, rows: list[Measurement] | None = None) -> list[Comparison]:
    return [predict(r, catalog) for r in (rows if rows is not None else shipped_measurements())]


def median_abs_error(comparisons: list[Comparison]) -> float:
    return statistics.median(abs(c.error) for c in comparisons)
