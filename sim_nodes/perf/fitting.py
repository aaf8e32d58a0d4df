"""Fitting the calibrated parameters, and the leave-one-out pass that keeps the fit honest.

Parameters are fitted per accelerator *kind* (catalogs/kinds.yaml), never per row: the kind
lists the fields fitted on its chips' rows and their bounds, and a field is shared by the
kind's chips unless a chip fits it alone (`fitted_alone`). The fit minimises the sum of squared
log errors (over- and under-prediction weigh the same) by Nelder-Mead within physical bounds.

Leave-one-out predicts each row with parameters fitted without it: that is the error a new
measurement should expect. A kind left with no rows keeps the catalog's values, or the kind's
priors where it states them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..catalogs import Catalog
from ..catalogs.kinds import SPECULATIVE_ACCEPTANCE, AcceleratorKind, accelerator_kinds
from . import fit_cache
from .calibration import (
    VENDOR_SPECULATIVE_ACCEPTANCE,
    Comparison,
    Measurement,
    predict,
    shipped_measurements,
)

__all__ = [
    "SPECULATIVE_ACCEPTANCE",
    "Group",
    "LeaveOneOut",
    "Parameter",
    "current_values",
    "fit",
    "fit_group",
    "groups",
    "leave_one_out",
    "predict_with",
    "priors",
    "sees",
    "with_values",
]


@dataclass(frozen=True, slots=True)
class Parameter:
    """One fitted quantity: an accelerator field shared by `accelerators`, within bounds."""

    name: str  # e.g. "gpu.compute_efficiency"
    field: str  # Accelerator field, or SPECULATIVE_ACCEPTANCE
    accelerators: tuple[str, ...]
    low: float
    high: float
    with_dtype: str | None = None  # priced only by rows whose weights are of this dtype
    prior: float | None = None  # its value when leave-one-out leaves its kind no rows


@dataclass(frozen=True, slots=True)
class Group:
    """Parameters fitted together, on the rows of their accelerators."""

    name: str
    accelerators: tuple[str, ...]
    parameters: tuple[Parameter, ...]


def _parameters(
    kind: AcceleratorKind, catalog: Catalog, members: tuple[str, ...]
) -> list[Parameter]:
    """A kind's parameters: each fitted field shared by the members that do not fit it alone
    (named after the kind, or after the member when it is the kind's only one), then one per
    member that does (named after it)."""
    out = []
    for f in kind.fitted:
        if f.field == SPECULATIVE_ACCEPTANCE:
            out.append(Parameter(f.field, f.field, members, f.low, f.high, prior=f.prior))
            continue
        having = tuple(
            n
            for n in members
            if f.with_dtype is None or f.with_dtype in catalog.accelerators[n].peak_tflops
        )
        if not having:
            continue
        apart = tuple(n for n in having if f.field in catalog.accelerators[n].fitted_alone)
        shared = tuple(n for n in having if n not in apart)
        prefix = kind.name if len(members) > 1 else members[0]
        out.append(
            Parameter(f"{prefix}.{f.field}", f.field, shared, f.low, f.high, f.with_dtype, f.prior)
        )
        out += [
            Parameter(f"{n}.{f.field}", f.field, (n,), f.low, f.high, f.with_dtype, f.prior)
            for n in apart
        ]
    return out


def sees(p: Parameter, row: Measurement, catalog: Catalog) -> bool:
    """Whether `row` depends on `p`: its accelerator's, and the kernel or feature it prices."""
    if row.accelerator not in p.accelerators:
        return False
    if p.field == SPECULATIVE_ACCEPTANCE:
        return bool(row.speculative)
    if p.field == "grouped_gemm_efficiency":
        return catalog.model(row.model).is_moe
    if p.with_dtype is not None:
        return row.weight_dtype == p.with_dtype
    return True


def groups(catalog: Catalog) -> list[Group]:
    """The parameter groups of `catalog`: one per accelerator kind that has accelerators in it,
    in the kinds' order."""
    out = []
    for kind in accelerator_kinds().values():
        members = tuple(n for n, a in catalog.accelerators.items() if a.kind == kind.name)
        if members:
            out.append(Group(kind.name, members, tuple(_parameters(kind, catalog, members))))
    return out


def priors(group: Group) -> dict[str, float]:
    """The values `group`'s parameters fall back on when no row of it is left to fit them."""
    return {p.name: p.prior for p in group.parameters if p.prior is not None}


Values = dict[str, float]


def current_values(catalog: Catalog) -> Values:
    """The parameters as the catalog (and calibration.py) hold them now."""
    out: Values = {}
    for g in groups(catalog):
        for p in g.parameters:
            if p.field == SPECULATIVE_ACCEPTANCE:
                out[p.name] = VENDOR_SPECULATIVE_ACCEPTANCE
            elif p.field == "fp4_compute_efficiency":
                out[p.name] = catalog.accelerator(p.accelerators[0]).compute_efficiency_for("fp4")
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


def _nelder_mead(
    f: Callable[[list[float]], float], start: list[float], evals: int = 1500
) -> list[float]:
    """Minimum of `f` over the unit cube, from `start` (Nelder-Mead, clipped to the cube).

    Coordinates are the parameters' log positions within their bounds: the parameters span
    decades and pull against each other (a wafer's per-step and per-layer costs), which one
    coordinate at a time crosses only in many small steps.
    """

    def clip(x: list[float]) -> list[float]:
        return [min(1.0, max(0.0, v)) for v in x]

    def value(x: list[float]) -> float:
        return f(clip(x))

    n = len(start)
    best = clip(start)
    for _ in range(3):  # restarts: a collapsed simplex rebuilt around the best point
        simplex = [best] + [
            [v + (0.1 if v < 0.9 else -0.1) * (i == j) for j, v in enumerate(best)]
            for i in range(n)
        ]
        scores = [value(x) for x in simplex]
        used = n + 1
        while used < evals // 3:
            order = sorted(range(n + 1), key=lambda i: scores[i])
            simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
            if scores[-1] - scores[0] < 1e-10:
                break
            centre = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
            worst = simplex[-1]

            def towards(
                t: float, worst: list[float] = worst, centre: list[float] = centre
            ) -> list[float]:
                return [c + t * (c - w) for c, w in zip(centre, worst, strict=True)]

            reflected = towards(1.0)
            r_score = value(reflected)
            used += 1
            if r_score < scores[0]:
                expanded = towards(2.0)
                e_score = value(expanded)
                used += 1
                simplex[-1], scores[-1] = (
                    (expanded, e_score) if e_score < r_score else (reflected, r_score)
                )
            elif r_score < scores[-2]:
                simplex[-1], scores[-1] = reflected, r_score
            else:
                contracted = towards(0.5 if r_score < scores[-1] else -0.5)
                c_score = value(contracted)
                used += 1
                if c_score < min(r_score, scores[-1]):
                    simplex[-1], scores[-1] = contracted, c_score
                else:  # shrink towards the best
                    simplex = [simplex[0]] + [
                        [b + 0.5 * (v - b) for b, v in zip(simplex[0], x, strict=True)]
                        for x in simplex[1:]
                    ]
                    scores = [scores[0]] + [value(x) for x in simplex[1:]]
                    used += n
        best = clip(min(zip(scores, simplex, strict=True))[1])
    return best


def fit_group(group: Group, rows: list[Measurement], catalog: Catalog, start: Values) -> Values:
    """Values of `group`'s parameters that best explain `rows` (of its accelerators).

    Only parameters some row sees are fitted (`sees`: an accelerator's own efficiencies need a
    row of it, the acceptance rate a speculative row); the others keep their `start` values.
    The answer is kept on disk for the next run with the same inputs and code (fit_cache.py).
    """
    mine = [r for r in rows if r.accelerator in group.accelerators and r.active]
    key = fit_cache.fit_key(
        repr(group), repr(mine), _catalog_key(catalog), repr(sorted(start.items()))
    )
    kept = fit_cache.load(key)
    if kept is None:
        kept = _fit_group(group, mine, catalog, start)
        fit_cache.store(key, kept)
    return kept


def _fit_group(group: Group, mine: list[Measurement], catalog: Catalog, start: Values) -> Values:
    values = dict(start)
    free = [p for p in group.parameters if any(sees(p, r, catalog) for r in mine)]
    if not free:
        return values
    spans = [(math.log(p.low), math.log(p.high)) for p in free]

    def unpack(x: list[float]) -> Values:
        return {
            p.name: math.exp(lo + v * (hi - lo))
            for p, (lo, hi), v in zip(free, spans, x, strict=True)
        }

    def loss(x: list[float]) -> float:
        return _loss(mine, catalog, {**values, **unpack(x)})

    start_x = [
        (math.log(min(max(values[p.name], p.low), p.high)) - lo) / (hi - lo)
        for p, (lo, hi) in zip(free, spans, strict=True)
    ]
    return {**values, **unpack(_nelder_mead(loss, start_x))}


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
    """Each active row predicted by parameters fitted on all the other rows. A refit per row
    takes tens of seconds in all, so the answer is kept for the process, per catalog and row
    set (both immutable once built)."""
    rows = rows if rows is not None else shipped_measurements()
    key = (_catalog_key(catalog), tuple(rows))
    found = _LOO_CACHE.get(key)
    if found is None:
        found = _LOO_CACHE[key] = _leave_one_out(catalog, rows)
    return list(found)


#: leave_one_out's answers, by catalog and row set.
_LOO_CACHE: dict[tuple[str, tuple[Measurement, ...]], list[LeaveOneOut]] = {}


def _catalog_key(catalog: Catalog) -> str:
    parts = [a.model_dump_json() for _, a in sorted(catalog.accelerators.items())]
    parts += [m.model_dump_json() for _, m in sorted(catalog.models.items())]
    return "\n".join(parts)


def _leave_one_out(catalog: Catalog, rows: list[Measurement]) -> list[LeaveOneOut]:
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
        values = fit_group(group, others, catalog, start) if peers else {**start, **priors(group)}
        out.append(LeaveOneOut(predict_with(row, catalog, values), not peers))
    return out
