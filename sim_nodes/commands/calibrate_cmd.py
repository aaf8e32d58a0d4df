"""`tiergate calibrate`: every published measurement next to the model's prediction."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..catalogs import default_catalog
from ..perf.calibration import (
    MAX_ERROR,
    MAX_MEDIAN_ERROR,
    compare_all,
    median_abs_error,
    parse_measurements,
)
from .common import CliError, table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--measurements", type=Path, default=None, help="CSV file (default: the shipped copy)"
    )


def run(args: argparse.Namespace) -> int:
    rows = None
    if args.measurements is not None:
        try:
            rows = parse_measurements(args.measurements.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CliError(f"cannot read {args.measurements}: {exc.strerror}") from None
        except (KeyError, ValueError) as exc:
            raise CliError(f"{args.measurements}: not a measurements CSV ({exc})") from None
    comparisons = compare_all(default_catalog(), rows)
    if not comparisons:
        raise CliError(f"{args.measurements}: no measurements to compare (an empty CSV?)")
    body = [
        [
            c.measurement.id,
            c.measurement.metric,
            f"{c.measurement.value:g} {c.measurement.unit}",
            f"{c.predicted:.4g}",
            f"{c.error:+.1%}",
            c.result.decode_step.bound,
        ]
        for c in comparisons
    ]
    print(table(["row", "metric", "measured", "predicted", "error", "bound"], body, left=2))
    worst = max(abs(c.error) for c in comparisons)
    median = median_abs_error(comparisons)
    ok = worst <= MAX_ERROR and median <= MAX_MEDIAN_ERROR
    print(
        f"\nmedian |error| {median:.1%} (limit {MAX_MEDIAN_ERROR:.0%}), "
        f"worst {worst:.1%} (limit {MAX_ERROR:.0%}): {'ok' if ok else 'OUT OF BOUNDS'}"
    )
    return 0 if ok else 1
