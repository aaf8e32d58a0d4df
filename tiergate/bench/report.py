"""Showing a `BenchReport`: the per-tier (and per-tenant) tables, the JSON file, the
speed-vs-cost chart.

The chart needs matplotlib, an optional extra (``pip install 'tiergate[plot]'``);
`require_matplotlib` checks for it up front so a run is not wasted on a missing plotter.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tiergate.bench.errors import BenchError
from tiergate.bench.fairness import TenantStats
from tiergate.bench.stats import BenchReport, RunInfo, SloTargets, TierStats
from tiergate.common.cli import table

__all__ = ["PLOT_INSTALL_HINT", "render_table", "require_matplotlib", "write_json", "write_plot"]

PLOT_INSTALL_HINT = "--plot needs matplotlib: pip install 'tiergate[plot]'"

_HEADERS = (
    "tier",
    "requests",
    "errors",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "tok/s/stream p50",
    "throughput tok/s",
    "$/1M out",
    "tool-call err",
    "escalations",
)

_TENANT_HEADERS = (
    "tenant",
    "concurrency",
    "sent",
    "ok",
    "429",
    "errors",
    "tokens served",
    "share",
    "tokens/s",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "tiers",
)


def _caps(run: RunInfo) -> str:
    low = run.min_max_tokens
    return str(run.max_tokens) if low is None else f"{low}-{run.max_tokens}"


def render_table(report: BenchReport) -> str:
    """The human-readable report: the per-tier table, error kinds if any, then the per-tenant
    table of a --tenants run."""
    run = report.run
    stats = [*report.tiers, report.total] if len(report.tiers) > 1 else report.tiers
    headers: tuple[str, ...] = _HEADERS
    rows = [_row(s) for s in stats]
    if run.slo is not None:
        headers = (*_HEADERS, f"SLO met ({_targets(run.slo)})")
        rows = [
            [*row, _number(s.slo_attainment, ".1%")] for row, s in zip(rows, stats, strict=True)
        ]
    lines = [
        f"{_sent(report)} to {run.url} in {report.wall_s:.2f}s "
        f"(concurrency {run.concurrency}, max_tokens {_caps(run)})",
        table(headers, rows),
    ]
    for s in report.tiers:
        for kind, count in s.errors_by_kind.items():
            example = s.error_examples.get(kind, "")
            lines.append(f"errors: {s.tier}: {kind} x{count}" + (f": {example}" if example else ""))
    if report.tenants:
        lines += ["", "per tenant (tokens served = prompt + completion of successful requests)"]
        lines.append(table(_TENANT_HEADERS, [_tenant_row(t) for t in report.tenants]))
    return "\n".join(lines)


def _targets(slo: SloTargets) -> str:
    """`TTFT <= 800 ms, TPOT <= 25 ms`, naming only the targets given."""
    named = (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms))
    return ", ".join(f"{name} <= {value:g} ms" for name, value in named if value is not None)


def _sent(report: BenchReport) -> str:
    """`100 requests`, `57 of 100 requests (--duration 10s)`, `12 of 100 requests (interrupted)`."""
    run, done = report.run, report.total.requests
    planned = run.requests
    sent = f"{done} of {planned} requests" if planned not in (None, done) else f"{done} requests"
    if run.duration_s is not None:
        sent += f" (--duration {run.duration_s:g}s)"
    return sent + (" (interrupted)" if run.interrupted else "")


def _row(s: TierStats) -> list[str]:
    tool = "n/a" if s.tool_call_error_rate is None else f"{s.tool_call_error_rate:.1%}"
    if s.tool_calls:
        tool += f" ({s.tool_call_errors}/{s.tool_calls})"
    return [
        s.tier,
        str(s.requests),
        str(s.errors),
        _number(s.ttft_p50_ms, ".1f"),
        _number(s.ttft_p95_ms, ".1f"),
        _number(s.output_tokens_per_s_per_stream_p50, ".1f"),
        f"{s.throughput_output_tokens_per_s:.1f}",
        _number(s.cost_per_million_output_tokens_usd, ".2f"),
        tool,
        str(s.escalations),
    ]


def _tenant_row(t: TenantStats) -> list[str]:
    share = t.tokens_served_share_pct
    return [
        t.tenant,
        str(t.concurrency),
        str(t.requests),
        str(t.ok),
        str(t.shed),
        str(t.errors),
        str(t.tokens_served),
        "n/a" if share is None else f"{share:.1f}%",
        f"{t.tokens_served_per_s:.1f}",
        _number(t.ttft_p50_ms, ".1f"),
        _number(t.ttft_p90_ms, ".1f"),
        ",".join(t.tiers) or "-",
    ]


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def write_json(report: BenchReport, path: Path) -> None:
    """Write the report as one JSON object."""
    try:
        path.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise BenchError(f"cannot write {path}: {exc.strerror or exc}") from None


def require_matplotlib() -> None:
    """Raise BenchError (with the install hint) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError(PLOT_INSTALL_HINT) from None


def write_plot(report: BenchReport, path: Path) -> None:
    """Per-stream speed (x) against cost per 1M output tokens (y), one labelled point per
    tier; an axis goes logarithmic when its values span more than 10x."""
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    points = [
        (s.tier, s.output_tokens_per_s_per_stream_p50, s.cost_per_million_output_tokens_usd)
        for s in report.tiers
    ]
    plotted = [(t, x, y) for t, x, y in points if x is not None and y is not None]
    if not plotted:
        measured = any(x is not None for _, x, _ in points)
        why = "the server reported no cost" if measured else "no request was answered"
        raise BenchError(f"--plot: no tier has both a speed and a cost ({why})")
    figure: Any = Figure(figsize=(6.4, 4.8))
    axes = figure.add_subplot()
    for tier, x, y in plotted:
        axes.scatter([x], [y], s=60)
        axes.annotate(tier, (x, y), textcoords="offset points", xytext=(6, 6))
    xs = [x for _, x, _ in plotted]
    ys = [y for _, _, y in plotted]
    for set_scale, axis, values in (
        (axes.set_xscale, axes.xaxis, xs),
        (axes.set_yscale, axes.yaxis, ys),
    ):
        if _spans_decade(values):
            set_scale("log")
            # Plain numbers (150, 1000) read better than 1.5x10^2; minor labels would collide.
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
    axes.margins(0.2)  # room for the labels of the outermost points
    axes.set_xlabel("output tokens/s per stream (p50)")
    axes.set_ylabel("USD per 1M output tokens")
    axes.set_title(f"tiergate bench: speed vs cost ({report.total.requests} requests)")
    axes.grid(True, which="both", alpha=0.3)
    skipped = [t for t, x, y in points if x is None or y is None]
    if skipped:
        axes.text(0.01, 0.01, f"no data: {', '.join(skipped)}", transform=axes.transAxes)
    try:
        figure.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise BenchError(f"cannot write {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # e.g. an image format matplotlib does not know
        raise BenchError(f"--plot {path}: {exc}") from None


def _spans_decade(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return (
        len(positive) == len(values)
        and max(positive) / min(positive) > 10
        and not any(math.isinf(v) for v in positive)
    )
