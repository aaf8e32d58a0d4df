"""Fitting the calibrated parameters, and the leave-one-out pass that keeps the fit honest.

Parameters are fitted per accelerator *group*, never per row: every HBM GPU shares one set
(bandwidth and compute efficiency, engine overhead, grouped-GEMM efficiency), WSE-3 has its
per-layer latency and wafer-to-wafer hop, the LPU its per-layer latency; the acceptance rate of
vendors' speculative drafts is fitted with the wafer rows (the only rows that decode
speculatively). The fit minimises the sum of squared log errors (over- and under-prediction
weigh the same) by coordinate descent within physical bounds.

Leave-one-out predicts each row with parameters fitted without it: that is the error a new
measurement should expect. A group left with no rows keeps the catalog's values (its prior).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..catalogs import Catalog
from .calibration import (
    VENDOR_SPECULATIVE_ACCEPTANCE,
    Comparison,
    Measurement,
    predict,
    shipped_measurements,
)

#: The acceptance-rate parameter's name (it belongs to no accelerator).
SPECULATIVE_ACCEPTANCE = "speculative.acceptance_rate"
#: Values a group falls back on when leave-one-out leaves it no rows: the estimates the
#: catalog held before any row of that group was fitted (groq-lpu: 40 us per layer).
PRIORS: dict[str, float] = {"groq-lpu.layer_latency_us": 40.0}


@dataclass(frozen=True, slots=True)
class Parameter:
    """One fitted quantity: an accelerator field shared by `accelerators`, within bounds."""

    name: str  # e.g. "gpu.compute_efficiency"
    field: str  # Accelerator field, or SPECULATIVE_ACCEPTANCE
    accelerators: tuple[str, ...]
    low: float
    high: float


@dataclass(frozen=True, slots=True)
class Group:
    """Parameters fitted together, on the rows of their accelerators."""

    name: str
    accelerators: tuple[str, ...]
    parameters: tuple[Parameter, ...]


def groups(catalog: Catalog) -> list[Group]:
    """The parameter groups of `catalog`: one per kind of accelerator that has rows."""
    gpus = tuple(n for n, a in catalog.accelerators.items() if a.memory_kind == "hbm")
    wse, lpu = ("wse-3",), ("groq-lpu",)
    return [
        Group(
            "GPU",
            gpus,
            (
                Parameter(
                    "gpu.memory_bandwidth_efficiency", "memory_bandwidth_efficiency", gpus, 0.4, 1.0
                ),
                Parameter("gpu.compute_efficiency", "compute_efficiency", gpus, 0.2, 1.0),
                Parameter("gpu.step_overhead_us", "step_overhead_us", gpus, 50.0, 3000.0),
                Parameter(
                    "gpu.grouped_gemm_efficiency", "grouped_gemm_efficiency", gpus, 0.05, 1.0
                ),
            ),
        ),
        Group(
            "WSE-3",
            wse,
            (
                Parameter("wse-3.layer_latency_us", "layer_latency_us", wse, 1.0, 60.0),
                Parameter(
                    "wse-3.interconnect_latency_us", "interconnect_latency_us", wse, 1.0, 500.0
                ),
                Parameter(SPECULATIVE_ACCEPTANCE, SPECULATIVE_ACCEPTANCE, wse, 0.05, 0.95),
            ),
        ),
        Group(
            "LPU",
            lpu,
            (Parameter("groq-lpu.layer_latency_us", "layer_latency_us", lpu, 2.0, 200.0),),
        ),
    ]


Values = dict[str, float]


def current_values(catalog: Catalog) -> Values:
    """The parameters as the catalog (and calibration.py) hold them now."""
    out: Values = {}
    for g in groups(catalog):
        for p in g.parameters:
            if p.field == SPECULATIVE_ACCEPTANCE:
                out[p.name] = VENDOR_SPECULATIVE_ACCEPTANCE
            else:
                out[p.name] = float(getattr(catalog.accelerator(p.accelerators[0]), p.field))
    return out


def with_values(catalog: Catalog, values: Values) -> tuple[Catalog, float]:
    """`catalog` with `values` applied, and the speculative acceptance rate."""
    updates: dict[str, dict[str, float]] = {}
    for g in groups(catalog):
        for p in g.parameters:
            if p.field == SPECULATIVE_ACCEPTANCE or p.name not in values:
                continue
            for acc in p.accelerators:
                updates.setdefault(acc, {})[p.field] = values[p.name]
    accelerators = [
        a.model_copy(update=updates[n]) if n in updates else a
        for n, a in catalog.accelerators.items()
    ]
    acceptance = values.get(SPECULATIVE_ACCEPTANCE, VENDOR_SPECULATIVE_ACCEPTANCE)
    return Catalog(accelerators, catalog.models.values()), acceptance


def predict_with(row: Measurement, catalog: Catalog, values: Values) -> Comparison:
    fitted, acceptance = with_values(catalog, values)
    return predict(row, fitted, acceptance)


def _loss(rows: Iterable[Measurement], catalog: Catalog, values: Values) -> float:
    fitted, acceptance = with_values(catalog, values)
    total = 0.0
    for r in rows:
        predicted = predict(r, fitted, acceptance).predicted
        total += math.log(max(predicted, 1e-12) / r.value) ** 2
    return total


def _golden(f: Callable[[float], float], low: float, high: float, steps: int) -> float:
    """Minimum of `f` on [low, high] (log-spaced search: parameters span decades)."""
    a, b = math.log(low), math.log(high)
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2.0)


def fit_group(
    group: Group, rows: list[Measurement], catalog: Catalog, start: Values, sweeps: int = 4
) -> Values:
    """Values of `group`'s parameters that best explain `rows` (of its accelerators)."""
    values = dict(start)
    mine = [r for r in rows if r.accelerator in group.accelerators and r.active]
    if not mine:
        return values
    for _ in range(sweeps):
        for p in group.parameters:

            def loss(x: float, name: str = p.name) -> float:
                return _loss(mine, catalog, {**values, name: x})

            best = _golden(loss, p.low, p.high, 18)
            if loss(best) <= loss(values[p.name]):
                values[p.name] = best
    return values


def fit(catalog: Catalog, rows: list[Measurement] | None = None) -> Values:
    """Every group's parameters fitted on `rows` (default: the shipped measurements)."""
    rows = rows if rows is not None else shipped_measurements()
    values = current_values(catalog)
    for g in groups(catalog):
        values = fit_group(g, rows, catalog, values)
    return values


@dataclass(frozen=True, slots=True)
class LeaveOneOut:
    comparison: Comparison
    prior_only: bool  # no other row of its group: predicted with the catalog's values


def leave_one_out(catalog: Catalog, rows: list[Measurement] | None = None) -> list[LeaveOneOut]:
    """Each active row predicted by parameters fitted on all the other rows."""
    rows = rows if rows is not None else shipped_measurements()
    start = current_values(catalog)
    out = []
    for row in rows:
        if not row.active:
            continue
        group = next((g for g in groups(catalog) if row.accelerator in g.accelerators), None)
        others = [r for r in rows if r is not row]
        if group is None:
            out.append(LeaveOneOut(predict_with(row, catalog, start), True))
            continue
        peers = [r for r in others if r.accelerator in group.accelerators and r.active]
        values = fit_group(group, others, catalog, start) if peers else {**start, **PRIORS}
        out.append(LeaveOneOut(predict_with(row, catalog, values), not peers))
    return out
