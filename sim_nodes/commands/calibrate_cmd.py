"""`tiergate calibrate`: every published measurement next to the model's prediction.

Each row is predicted twice: with the catalog's parameters (the fit) and with parameters
fitted on every other row (leave-one-out, the honest figure). Errors are summarised by family.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tiergate.common.cli import CliError, table

from ..catalogs import default_catalog
from ..perf.calibration import (
    FAMILIES,
    MAX_ERROR,
    MAX_LOO_FACTOR,
    MAX_LOO_MEDIAN_ERROR,
    MAX_MEDIAN_ERROR,
    Comparison,
    MeasurementsError,
    active,
    compare_all,
    median_abs_error,
    parse_measurements,
)
from ..perf.fitting import LeaveOneOut, current_values, fit, leave_one_out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--measurements", type=Path, default=None, help="CSV file (default: the shipped copy)"
    )
    p.add_argument(
        "--no-loo", action="store_true", help="skip the leave-one-out pass (it refits per row)"
    )
    p.add_argument(
        "--fit",
        action="store_true",
        help="also print the parameters the rows give, beside the catalog's",
    )


def run(args: argparse.Namespace) -> int:
    rows = None
    if args.measurements is not None:
        try:
            text = args.measurements.read_text(encoding="utf-8")
            rows = parse_measurements(text, str(args.measurements))
        except OSError as exc:
            raise CliError(f"cannot read {args.measurements}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise CliError(f"{args.measurements}: not UTF-8 text") from None
        except MeasurementsError as exc:
            raise CliError(str(exc)) from None
    catalog = default_catalog()
    comparisons = compare_all(catalog, rows)
    if not active(comparisons):
        raise CliError(f"{args.measurements}: no measurements to compare (an empty CSV?)")
    loo = (
        {}
        if args.no_loo
        else {x.comparison.measurement.id: x for x in leave_one_out(catalog, rows)}
    )
    body = []
    for c in comparisons:
        m = c.measurement
        held = loo.get(m.id)
        loo_cell = (
            ""
            if held is None
            else f"{held.comparison.error:+.1%}" + (" (prior)" if held.prior_only else "")
        )
        body.append(
            [
                m.id,
                c.family,
                f"{m.value:g} {m.unit}",
                f"{c.predicted:.4g}",
                f"{c.error:+.1%}" if m.active else f"({c.error:+.1%})",
                loo_cell if m.active else "superseded",
                c.result.decode_step.bound,
            ]
        )
    print(
        table(
            ["row", "family", "measured", "predicted", "fit", "leave-one-out", "bound"],
            body,
            left=3,
        )
    )
    print()
    print(_by_family(comparisons, loo))
    worst = max(abs(c.error) for c in active(comparisons))
    median = median_abs_error(comparisons)
    ok = worst <= MAX_ERROR and median <= MAX_MEDIAN_ERROR
    print(
        f"\nfit: median |error| {median:.1%} (limit {MAX_MEDIAN_ERROR:.0%}), "
        f"worst {worst:.1%} (limit {MAX_ERROR:.0%}): {'ok' if ok else 'OUT OF BOUNDS'}"
    )
    if loo:
        loo_median = statistics.median(abs(x.comparison.error) for x in loo.values())
        loo_worst = max(x.comparison.factor for x in loo.values())
        loo_ok = loo_median <= MAX_LOO_MEDIAN_ERROR and loo_worst <= MAX_LOO_FACTOR
        ok = ok and loo_ok
        print(
            f"leave-one-out: median |error| {loo_median:.1%} (limit {MAX_LOO_MEDIAN_ERROR:.0%}), "
            f"worst {loo_worst:.2f}x (limit {MAX_LOO_FACTOR:g}x): "
            f"{'ok' if loo_ok else 'OUT OF BOUNDS'}"
        )
    if args.fit:
        now, best = current_values(catalog), fit(catalog, rows)
        print()
        print(
            table(
                ["parameter", "catalog", "fitted on these rows"],
                [[k, f"{now[k]:.3g}", f"{best[k]:.3g}"] for k in now],
                left=1,
            )
        )
    return 0 if ok else 1


def _by_family(comparisons: list[Comparison], loo: dict[str, LeaveOneOut]) -> str:
    body = []
    for family in FAMILIES:
        mine = [c for c in active(comparisons) if c.family == family]
        if not mine:
            continue
        fit_errors = [abs(c.error) for c in mine]
        row = [
            family,
            str(len(mine)),
            f"{statistics.median(fit_errors):.1%}",
            f"{max(fit_errors):.1%}",
        ]
        held = [loo[c.measurement.id] for c in mine if c.measurement.id in loo]
        if held:
            errors = [abs(h.comparison.error) for h in held]
            factors = [h.comparison.factor for h in held]
            row += [f"{statistics.median(errors):.1%}", f"{max(factors):.2f}x"]
        else:
            row += ["", ""]
        body.append(row)
    return table(
        ["family", "rows", "fit median", "fit worst", "LOO median", "LOO worst"], body, left=1
    )
