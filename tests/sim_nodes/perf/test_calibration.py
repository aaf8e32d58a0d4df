"""The model against published measurements: one parameter set must explain every row."""

import statistics
from pathlib import Path

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf.calibration import (
    FAMILIES,
    MAX_ERROR,
    MAX_LOO_FACTOR,
    MAX_LOO_MEDIAN_ERROR,
    MAX_MEDIAN_ERROR,
    active,
    compare_all,
    median_abs_error,
    parse_measurements,
    shipped_measurements,
)
from tiergate.sim_nodes.perf.fitting import LeaveOneOut, current_values, fit, leave_one_out

SHARED = Path(__file__).resolve().parents[4] / "shared" / "calibration" / "measurements.csv"


@pytest.mark.skipif(not SHARED.exists(), reason="shared/ is not beside this checkout")
def test_shipped_rows_include_every_shared_row_unchanged() -> None:
    """The shipped copy extends the shared file: its rows are all there, with their values."""
    shipped = {r.id: r for r in shipped_measurements()}
    for r in parse_measurements(SHARED.read_text()):
        assert r.id in shipped, r.id
        assert (shipped[r.id].model, shipped[r.id].value) == (r.model, r.value)


def test_every_row_has_a_source_a_date_and_a_kind() -> None:
    for r in shipped_measurements():
        assert r.source and r.date and r.kind, r.id


def test_every_family_has_rows(catalog: Catalog) -> None:
    families = {c.family for c in active(compare_all(catalog))}
    assert families == set(FAMILIES)


def test_every_row_is_within_bounds(catalog: Catalog) -> None:
    comparisons = active(compare_all(catalog))
    assert len(comparisons) >= 20
    off = {c.measurement.id: f"{c.error:+.1%}" for c in comparisons if abs(c.error) > MAX_ERROR}
    assert not off, f"predictions more than {MAX_ERROR:.0%} off: {off}"


def test_median_error_is_small(catalog: Catalog) -> None:
    assert median_abs_error(compare_all(catalog)) <= MAX_MEDIAN_ERROR


def test_the_catalog_holds_the_fitted_parameters(catalog: Catalog) -> None:
    """Refitting moves no parameter by more than a quarter: the catalog is the fit."""
    now, best = current_values(catalog), fit(catalog)
    moved = {k: (now[k], round(best[k], 3)) for k in now if abs(best[k] / now[k] - 1) > 0.25}
    assert not moved, moved


@pytest.fixture(scope="module")
def loo() -> list[LeaveOneOut]:
    from tiergate.sim_nodes.catalogs import default_catalog

    return leave_one_out(default_catalog())


def test_leave_one_out_median_error(loo: list[LeaveOneOut]) -> None:
    assert statistics.median(abs(x.comparison.error) for x in loo) <= MAX_LOO_MEDIAN_ERROR


def test_leave_one_out_worst_factor(loo: list[LeaveOneOut]) -> None:
    worst = max(loo, key=lambda x: x.comparison.factor)
    assert worst.comparison.factor <= MAX_LOO_FACTOR, worst.comparison.measurement.id


def test_the_check_can_fail(catalog: Catalog) -> None:
    """Halving the H100's bandwidth must push the H100 rows out of bounds."""
    slow = catalog.accelerator("h100-sxm").model_copy(update={"memory_bandwidth_tb_per_s": 1.6})
    broken = Catalog([*catalog.accelerators.values(), slow], catalog.models.values())
    errors = {c.measurement.id: c.error for c in compare_all(broken)}
    assert errors["h100-8b-c1"] > 0.8
