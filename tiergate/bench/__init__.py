"""`tiergate bench`: an async load generator for a tiergate router or any OpenAI-compatible
server, reporting per tier served: TTFT, per-stream speed, throughput, cost per 1M output
tokens, tool-call error rate and escalations; and per tenant (--tenants), the share of service
each got.

Layers: `workload` (what to send, pure and seeded) and `tenants` (who sends it, --tenants) ->
`client` (one request -> `RequestResult`) -> `pacing` and `runner` (the run) -> `stats` and
`fairness` (aggregation per tier and per tenant, pure) -> `report` (tables, JSON, chart);
`command` is the CLI.
"""

from tiergate.bench.errors import BenchError
from tiergate.bench.fairness import TenantStats
from tiergate.bench.results import RequestResult
from tiergate.bench.runner import BenchSettings, run_bench
from tiergate.bench.stats import BenchReport, RunInfo, TierStats, summarize
from tiergate.bench.tenants import BenchTenant, load_tenants
from tiergate.bench.workload import Workload, parse_mix

__all__ = [
    "BenchError",
    "BenchReport",
    "BenchSettings",
    "BenchTenant",
    "RequestResult",
    "RunInfo",
    "TenantStats",
    "TierStats",
    "Workload",
    "load_tenants",
    "parse_mix",
    "run_bench",
    "summarize",
]
