"""The fit: it finds parameters the rows were made with, and leaves alone what no row sees."""

import dataclasses

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf.calibration import shipped_measurements
from tiergate.sim_nodes.perf.fitting import (
    SPECULATIVE_ACCEPTANCE,
    current_values,
    fit,
    groups,
    predict_with,
)

WAFER = {
    "wse-3.step_overhead_us": 200.0,
    "wse-3.layer_latency_us": 5.0,
    "wse-3.interconnect_latency_us": 40.0,
}


def test_the_fit_recovers_the_wafer_parameters_that_made_the_rows(catalog: Catalog) -> None:
    """Rows priced with known wafer costs: the fit, started from the catalog, finds them."""
    truth = {**current_values(catalog), **WAFER}
    plain = [
        dataclasses.replace(r, speculative="")
        for r in shipped_measurements()
        if r.accelerator == "wse-3" and r.active
    ]
    rows = [dataclasses.replace(r, value=predict_with(r, catalog, truth).predicted) for r in plain]
    found = fit(catalog, rows)
    for name, value in WAFER.items():
        assert found[name] == pytest.approx(value, rel=0.05), name
    for r in rows:
        assert predict_with(r, catalog, found).error == pytest.approx(0.0, abs=0.01), r.id


def test_a_parameter_no_row_sees_keeps_its_value(catalog: Catalog) -> None:
    """Without B200 rows B200's own efficiencies stay put; without a speculative row, so does
    the acceptance rate."""
    rows = [
        r
        for r in shipped_measurements()
        if r.accelerator not in ("b200", "wse-3")
        or (r.accelerator == "wse-3" and not r.speculative)
    ]
    start, found = current_values(catalog), fit(catalog, rows)
    own = [p.name for g in groups(catalog) for p in g.parameters if p.accelerators == ("b200",)]
    assert own
    for name in [*own, SPECULATIVE_ACCEPTANCE]:
        assert found[name] == start[name], name
