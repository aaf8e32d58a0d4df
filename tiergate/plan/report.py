"""What `tiergate plan` answers: pydantic models (the `--json` output) and the text tables.

Seconds and USD are in the field names. A prediction says where its numbers come from: the
simulator (percentiles over the tier's replayed requests) or, for a configuration the prune
never simulated, the steady-state model (means, shown in the p50 columns; no p90).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tiergate.common.cli import table

__all__ = [
    "Configuration",
    "PlanReport",
    "Prediction",
    "SearchCounts",
    "SimulatedWindow",
    "TierPlan",
    "render",
]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Configuration(_Out):
    """One replica's configuration, as a pool spec sets it."""

    summary: str = Field(description="The configuration in one short line.")
    model: str
    accelerator: str
    chips: int
    tensor_parallel: int
    pipeline_stages: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int
    max_batched_tokens: int
    draft_model: str | None = None
    speculative_tokens: int | None = None
    acceptance_rate: float | None = None


class Prediction(_Out):
    """A configuration at a replica count and what it gives the tier's traffic."""

    configuration: Configuration
    replicas: int
    source: Literal["simulation", "steady-state"]
    ttft_p50_s: float
    ttft_p90_s: float | None
    tpot_p50_s: float
    tpot_p90_s: float | None
    slo_attainment: float | None = Field(description="Share of requests meeting both targets.")
    meets_slo: bool
    steady_state_floor_replicas: int | None = Field(
        default=None, description="Fewest replicas whose steady-state capacity covers the rate."
    )
    cost_per_hour_usd: float = Field(description="All replicas.")
    cost_per_million_output_tokens_usd: float = Field(description="At the tier's offered load.")


class SearchCounts(_Out):
    """How the search spent its effort on one tier."""

    configurations: int = Field(description="Configurations the catalog and rules allow.")
    unfit: int = Field(description="Weights or one request do not fit.")
    too_slow: int = Field(description="Miss the SLO even at batch 1 (steady state).")
    pruned_by_cost: int = Field(description="Steady-state floor costs at least the plan.")
    simulated: int = Field(description="Configurations confirmed in the simulator.")
    simulations: int = Field(description="Simulator runs (one per replica count tried).")

    @property
    def avoided(self) -> int:
        """Configurations the steady-state prune kept out of the simulator."""
        return self.configurations - self.simulated


class SimulatedWindow(_Out):
    """The requests the plan's (or the closest) trial simulated, and which it measured."""

    requests: int
    measured_requests: int = Field(description="Arrived after the warm-up, before the cool-down.")
    replicas_simulated: int = Field(description="The fleet, or a slice given its share.")
    fleet_replicas: int
    arrivals_span_s: float
    request_lifetime_s: float = Field(description="Steady-state TTFT + (output - 1) x TPOT.")
    lifetimes: float = Field(description="Request lifetimes the arrivals span.")
    cut_by_budget: bool = Field(description="The simulation budget cut the window short.")


class TierPlan(_Out):
    """One tier's answer: the plan (or the closest miss), the runner-up and why it lost."""

    tier: str
    model: str
    engine: str = Field(description="What runs the tier's pools: sim, vllm or sglang.")
    rate_per_s: float
    mean_prompt_tokens: int
    mean_cached_prompt_tokens: int
    mean_output_tokens: int
    requests_simulated: int
    window: SimulatedWindow | None = Field(description="The plan's (or closest's) window.")
    slo_percentile: float
    slo_ttft_ms: float
    slo_tpot_ms: float
    met: bool
    plan: Prediction | None = Field(description="The cheapest fleet meeting the SLO.")
    closest: Prediction | None = Field(description="When nothing meets it: the nearest miss.")
    runner_up: Prediction | None
    runner_up_lost_because: str | None
    verdict: str = Field(description="One line: the plan, or why there is none.")
    search: SearchCounts


class PlanReport(_Out):
    """The whole plan."""

    name: str
    met: bool
    cost_per_hour_usd: float = Field(description="Every met tier's planned fleet.")
    tiers: list[TierPlan]


def render(report: PlanReport) -> str:
    """The plan as text: a table per tier, then the fleet total."""
    blocks = [_tier(t) for t in report.tiers]
    configurations = sum(t.search.configurations for t in report.tiers)
    simulated = sum(t.search.simulated for t in report.tiers)
    met = [t for t in report.tiers if t.met]
    blocks.append(
        f"fleet: ${report.cost_per_hour_usd:,.2f}/h for {len(met)} of {len(report.tiers)} "
        f"tier(s) planned; {configurations} configurations searched, {simulated} simulated, "
        f"{configurations - simulated} kept out of the simulator by the steady-state prune"
    )
    return "\n\n".join(blocks)


def _tier(t: TierPlan) -> str:
    cached = f" ({t.mean_cached_prompt_tokens} cached)" if t.mean_cached_prompt_tokens else ""
    engine = "" if t.engine == "sim" else f" on {t.engine}"
    head = (
        f"tier {t.tier}: {t.model}{engine} at {t.rate_per_s:.3g} req/s, prompt "
        f"{t.mean_prompt_tokens}{cached}, output {t.mean_output_tokens} tokens (means); "
        f"SLO p{t.slo_percentile:g} TTFT <= {t.slo_ttft_ms:g} ms and TPOT <= {t.slo_tpot_ms:g} ms"
    )
    rows = []
    if t.plan is not None:
        rows.append(_row("plan", t.plan))
    if t.closest is not None:
        rows.append(_row("closest", t.closest))
    if t.runner_up is not None:
        rows.append(_row("runner-up", t.runner_up))
    headers = ["", "configuration", "replicas", "TTFT p50", "p90", "TPOT p50", "p90"]
    headers += ["attained", "$/hour", "$/1M out"]
    lines = [head, table(headers, rows, left=2)] if rows else [head]
    if t.runner_up_lost_because:
        lines.append(f"runner-up lost: {t.runner_up_lost_because}")
    s = t.search
    lines.append(
        f"search: {s.configurations} configurations: {s.unfit} do not fit, {s.too_slow} too "
        f"slow at batch 1, {s.pruned_by_cost} pruned on cost, {s.simulated} simulated "
        f"({s.simulations} runs)"
    )
    if t.window is not None:
        lines.append(_window(t.window))
    lines.append(("" if t.met else "NOT MET: ") + t.verdict)
    return "\n".join(lines)


def _window(w: SimulatedWindow) -> str:
    fleet = (
        f"{w.replicas_simulated} replicas"
        if w.replicas_simulated == w.fleet_replicas
        else f"a slice of {w.replicas_simulated} of the {w.fleet_replicas} replicas (its share "
        f"of the traffic)"
    )
    cut = ", cut short by the simulation budget" if w.cut_by_budget else ""
    return (
        f"window: {w.requests:,} requests to {fleet}, arriving over {w.arrivals_span_s:.3g} s "
        f"= {w.lifetimes:.2g} request lifetimes of {w.request_lifetime_s:.3g} s{cut}; "
        f"{w.measured_requests:,} measured between the warm-up and the cool-down"
    )


def _row(role: str, p: Prediction) -> list[str]:
    def ms(v: float | None, digits: int) -> str:
        return "-" if v is None else f"{v * 1000:.{digits}f}"

    steady = " (steady state)" if p.source == "steady-state" else ""
    return [
        role,
        p.configuration.summary + steady,
        str(p.replicas),
        ms(p.ttft_p50_s, 0),
        ms(p.ttft_p90_s, 0),
        ms(p.tpot_p50_s, 2),
        ms(p.tpot_p90_s, 2),
        "-" if p.slo_attainment is None else f"{p.slo_attainment:.1%}",
        f"{p.cost_per_hour_usd:,.2f}",
        f"{p.cost_per_million_output_tokens_usd:,.2f}",
    ]
