"""The model against published measurements: one parameter set must explain every row."""

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf.calibration import (
    FAMILIES,
    MAX_ERROR,
    MAX_LOO_FACTOR,
    MAX_LOO_MEDIAN_ERROR,
    MAX_MEDIAN_ERROR,
    Measurement,
    active,
    compare_all,
    median_abs_error,
    parse_measurements,
    shipped_measurements,
)
from tiergate.sim_nodes.perf.fitting import LeaveOneOut, current_values, fit, leave_one_out

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

#: The published rows the calibration is anchored on, as published (the shipped
#: catalog extends them: more rows, longer sources). A copy in the repo, so the check runs
#: on any clone.
PUBLISHED = Path(__file__).with_name("published_measurements.csv")
#: What a row says was measured, and what was measured: a source may grow, these may not.
MEASURED_FIELDS = (
    "model", "accelerator", "chips", "tensor_parallel", "weight_dtype", "kv_dtype",
    "concurrency", "input_tokens", "output_tokens", "metric", "value", "unit", "kind",
)  # fmt: skip


def rows_changed(published: list[Measurement], shipped: list[Measurement]) -> dict[str, str]:
    """Each published row the shipped rows lack or measure differently, with what differs."""
    by_id = {r.id: r for r in shipped}
    changed = {}
    for r in published:
        mine = by_id.get(r.id)
        if mine is None:
            changed[r.id] = "missing"
            continue
        fields = [f for f in MEASURED_FIELDS if getattr(mine, f) != getattr(r, f)]
        if fields:
            changed[r.id] = ", ".join(fields)
    return changed


def test_shipped_rows_include_every_published_row_unchanged() -> None:
    """The shipped copy extends the published rows: each is there, measuring the same thing
    with the same value."""
    published = parse_measurements(PUBLISHED.read_text(encoding="utf-8"))
    assert len(published) >= 10
    assert rows_changed(published, shipped_measurements()) == {}


def test_a_published_row_edited_or_dropped_is_caught() -> None:
    published = parse_measurements(PUBLISHED.read_text(encoding="utf-8"))
    shipped = shipped_measurements()
    first, second = published[0].id, published[1].id
    edited = [replace(r, value=r.value * 1.1) if r.id == first else r for r in shipped]
    assert rows_changed(published, edited) == {first: "value"}
    dropped = [r for r in shipped if r.id != second]
    assert rows_changed(published, dropped) == {second: "missing"}


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
