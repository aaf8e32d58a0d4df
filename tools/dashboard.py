"""Write the Grafana dashboard the Helm chart ships (charts/tiergate/dashboards/tiergate.json),
built with grafana-foundation-sdk from the panel list below. Run it after changing a panel:

    python -P tools/dashboard.py            # rewrite the JSON
    python -P tools/dashboard.py --check    # exit 1 if the JSON is not what this writes

tests/chart/test_chart_dashboard.py runs the check; tests/monitoring/ evaluates every query
of the JSON against a real Prometheus scraping a running router and its sim nodes.

Router metrics are labelled by tier (`tier`, or `tier_served` for requests); sim-node metrics
(vLLM names) by the `pool` and `tier` labels the scrape adds (the chart's PodMonitor copies
them from the pods' labels tiergate.dev/pool and tiergate.dev/tier).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos, VariableRefresh

OUTPUT = Path(__file__).resolve().parent.parent / "charts" / "tiergate" / "dashboards"
OUTPUT /= "tiergate.json"
UID = "tiergate-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
TIER = 'tier=~"$tier"'
POOL = 'pool=~"$pool"'
TENANT = 'tenant=~"$tenant"'


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    targets: tuple[Target, ...]


def quantiles(metric: str, by: str, selector: str) -> tuple[Target, ...]:
    """p50 and p99 of a histogram, by one label `by`."""
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"{{{{{by}}}}} p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    )


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Traffic and cost, per tier",
        (
            Panel(
                "Requests/s by outcome",
                "Completion requests by the tier that served them and how they ended.",
                "reqps",
                (
                    Target(
                        "sum by (tier_served, outcome) "
                        f'(rate(tiergate_requests_total{{tier_served=~"$tier"}}[{RATE}]))',
                        "{{tier_served}} {{outcome}}",
                    ),
                ),
            ),
            Panel(
                "Tokens/s",
                "Prompt and output tokens served, by tier.",
                "short",
                (
                    Target(
                        f"sum by (tier, kind) (rate(tiergate_tokens_total{{{TIER}}}[{RATE}]))",
                        "{{tier}} {{kind}}",
                    ),
                ),
            ),
            Panel(
                "Cost per hour",
                "USD billed per hour at the served tier's price, at the current rate.",
                "currencyUSD",
                (
                    Target(
                        f"sum by (tier) (rate(tiergate_cost_usd_total{{{TIER}}}[{RATE}])) * 3600",
                        "{{tier}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Latency",
        (
            Panel(
                "Time to first token (router)",
                "p50 and p99 of the time to first token clients see, by tier.",
                "s",
                quantiles("tiergate_time_to_first_token_seconds", "tier", TIER),
            ),
            Panel(
                "Time per output token (router)",
                "p50 and p99 of the mean time per output token after the first, by tier.",
                "s",
                quantiles("tiergate_time_per_output_token_seconds", "tier", TIER),
            ),
            Panel(
                "Time to first token at the nodes, by pool",
                "p50 and p99 of vllm:time_to_first_token_seconds, by pool.",
                "s",
                quantiles("vllm:time_to_first_token_seconds", "pool", f"{TIER}, {POOL}"),
            ),
        ),
    ),
    (
        "Admission: shedding, refusals, queues",
        (
            Panel(
                "Shed and refused requests/s",
                "Shed: refused by admission control (429/503 with Retry-After). Refused: "
                "before routing (rate limits, budgets, tier not allowed).",
                "reqps",
                (
                    Target(
                        f"sum by (tier, priority) (rate(tiergate_shed_total{{{TIER}}}[{RATE}]))",
                        "shed {{tier}} {{priority}}",
                    ),
                    Target(
                        "sum by (tier_requested) (rate(tiergate_requests_total"
                        f'{{outcome="rejected", tier_requested=~"$tier"}}[{RATE}]))',
                        "refused {{tier_requested}}",
                    ),
                ),
            ),
            Panel(
                "Queue depth",
                "Requests waiting at each tier's endpoints (router's view), and at each "
                "pool's nodes (vllm:num_requests_waiting).",
                "short",
                (
                    Target(f"sum by (tier) (tiergate_queue_depth{{{TIER}}})", "tier {{tier}}"),
                    Target(
                        f"sum by (pool) (vllm:num_requests_waiting{{{TIER}, {POOL}}})",
                        "pool {{pool}}",
                    ),
                ),
            ),
            Panel(
                "Admission wait p99, by tenant",
                "How long admitted requests waited in their tier's queue at the router.",
                "s",
                (
                    Target(
                        "histogram_quantile(0.99, sum by (tier, tenant, le) (rate("
                        f"tiergate_admission_wait_seconds_bucket{{{TIER}, {TENANT}}}[{RATE}])))",
                        "{{tier}} {{tenant}}",
                    ),
                ),
            ),
            Panel(
                "Spills/s",
                "Requests moved from their tier to another, by reason (saturated, slo).",
                "reqps",
                (
                    Target(
                        "sum by (from_tier, to_tier, reason) (rate(tiergate_spills_total"
                        f'{{from_tier=~"$tier"}}[{RATE}]))',
                        "{{from_tier}} -> {{to_tier}} {{reason}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Pools and nodes",
        (
            Panel(
                "KV-cache use of the nodes, by pool",
                "vllm:kv_cache_usage_perc: the fullest node of each pool, and the mean.",
                "percentunit",
                (
                    Target(
                        f"max by (pool) (vllm:kv_cache_usage_perc{{{TIER}, {POOL}}})",
                        "{{pool}} max",
                    ),
                    Target(
                        f"avg by (pool) (vllm:kv_cache_usage_perc{{{TIER}, {POOL}}})",
                        "{{pool}} mean",
                    ),
                ),
            ),
            Panel(
                "Running requests at the nodes, by pool",
                "vllm:num_requests_running summed over each pool's nodes.",
                "short",
                (
                    Target(
                        f"sum by (pool) (vllm:num_requests_running{{{TIER}, {POOL}}})",
                        "{{pool}}",
                    ),
                ),
            ),
            Panel(
                "Endpoints by state, per pool",
                "Ready, ejected by outlier detection, or unreachable (scrapes failing), as "
                "the router sees them (the most any router replica sees).",
                "short",
                (
                    Target(
                        f"max by (pool, state) (tiergate_pool_endpoints{{{TIER}, {POOL}}})",
                        "{{pool}} {{state}}",
                    ),
                ),
            ),
            Panel(
                "Upstream retries/s",
                "Attempts beyond the first (another endpoint tried after a failure).",
                "reqps",
                (
                    Target(
                        f"sum(rate(tiergate_upstream_retries_total[{RATE}]))",
                        "retries",
                    ),
                ),
            ),
        ),
    ),
    (
        "Tenants",
        (
            Panel(
                "Budget use",
                "Spend in the current budget period over the budget, per tenant with one.",
                "percentunit",
                (
                    Target(
                        "max by (tenant, period) (tiergate_tenant_budget_spent_usd"
                        f"{{{TENANT}}}) / max by (tenant, period) "
                        f"(tiergate_tenant_budget_usd{{{TENANT}}})",
                        "{{tenant}} ({{period}})",
                    ),
                ),
            ),
            Panel(
                "Attained service share",
                "Each tenant's share of the tokens a tier served (what fair sharing "
                "equalises by weight).",
                "percentunit",
                (
                    Target(
                        "sum by (tier, tenant) (rate(tiergate_tenant_attained_tokens_total"
                        f"{{{TIER}, {TENANT}}}[{RATE}])) / ignoring (tenant) group_left "
                        "sum by (tier) (rate(tiergate_tenant_attained_tokens_total"
                        f"{{{TIER}}}[{RATE}]))",
                        "{{tier}} {{tenant}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Usage ledger",
        (
            Panel(
                "Ledger backlog and dropped records",
                "Records held in memory while the ledger's database refuses writes, and "
                "records lost (per second).",
                "short",
                (
                    Target("max(tiergate_ledger_backlog_records)", "backlog"),
                    Target(
                        f"sum(rate(tiergate_ledger_dropped_records_total[{RATE}]))",
                        "dropped/s",
                    ),
                ),
            ),
            Panel(
                "Ledger WAL and database size",
                "The SQLite ledger's write-ahead log and the bytes its database uses.",
                "bytes",
                (
                    Target("max(tiergate_ledger_wal_bytes)", "WAL"),
                    Target("max(tiergate_ledger_used_bytes)", "database"),
                ),
            ),
        ),
    ),
)


def variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def build() -> dict[str, object]:
    """The dashboard as the JSON object Grafana imports."""
    board = (
        dashboard.Dashboard("tiergate")
        .uid(UID)
        .description("Tiers, pools, tenants and the usage ledger of a tiergate router.")
        .tags(["tiergate", "llm-inference"])
        .time("now-1h", "now")
        .refresh("30s")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(variable("tier", "Tier", "label_values(tiergate_endpoints, tier)"))
        .with_variable(
            variable("pool", "Pool", 'label_values(tiergate_pool_endpoints{tier=~"$tier"}, pool)')
        )
        .with_variable(
            variable(
                "tenant", "Tenant", "label_values(tiergate_tenant_attained_tokens_total, tenant)"
            )
        )
    )
    panel_id = 0
    for row_title, panels in ROWS:
        panel_id += 1
        # A row that is not collapsed holds no panels: its panels follow it on the board.
        board = board.with_row(dashboard.Row(row_title).id(panel_id))
        width = 24 // len(panels)
        for spec in panels:
            panel_id += 1
            panel = (
                timeseries.Panel()
                .id(panel_id)
                .title(spec.title)
                .description(spec.description)
                .datasource(DATASOURCE)
                .unit(spec.unit)
                .grid_pos(GridPos(h=8, w=width))
            )
            for index, target in enumerate(spec.targets):
                panel = panel.with_target(
                    prometheus.Dataquery()
                    .expr(target.expr)
                    .legend_format(target.legend)
                    .ref_id(chr(ord("A") + index))
                    .datasource(DATASOURCE)
                )
            board = board.with_panel(panel)
    encoded: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def text() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON is out of date")
    args = parser.parse_args()
    wanted = text()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != wanted:
            print(f"{OUTPUT} is out of date: run python -P tools/dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(wanted)
    print(f"{OUTPUT}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
