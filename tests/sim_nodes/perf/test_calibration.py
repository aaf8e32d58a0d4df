"""The model against published measurements: one parameter set must explain every row."""

from pathlib import Path

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf.calibration import (
    MAX_ERROR,
    MAX_MEDIAN_ERROR,
    compare_all,
    median_abs_error,
    shipped_measurements,
)

SHARED = Path(__file__).resolve().parents[4] / "shared" / "calibration" / "measurements.csv"
SHIPPED = Path(__file__).resolve().parents[3] / "sim_nodes" / "catalogs" / "measurements.csv"


@pytest.mark.skipif(not SHARED.exists(), reason="shared/ is not beside this checkout")
def test_shipped_copy_matches_the_shared_measurements() -> None:
    assert SHIPPED.read_text() == SHARED.read_text()


def test_every_row_is_within_bounds(catalog: Catalog) -> None:
    comparisons = compare_all(catalog)
    assert len(comparisons) == len(shipped_measurements()) >= 10
    off = {c.measurement.id: f"{c.error:+.1%}" for c in comparisons if abs(c.error) > MAX_ERROR}
    assert not off, f"predictions more than {MAX_ERROR:.0%} off: {off}"


def test_median_error_is_small(catalog: Catalog) -> None:
    assert median_abs_error(compare_all(catalog)) <= MAX_MEDIAN_ERROR


def test_the_check_can_fail(catalog: Catalog) -> None:
    """Halving the H100's bandwidth must push the H100 rows out of bounds."""
    slow = catalog.accelerator("h100-sxm").model_copy(update={"memory_bandwidth_tb_per_s": 1.6})
    broken = Catalog([*catalog.accelerators.values(), slow], catalog.models.values())
    errors = {c.measurement.id: c.error for c in compare_all(broken)}
    assert abs(errors["h100-8b-c1"]) > MAX_ERROR
