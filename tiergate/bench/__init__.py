"""`tiergate bench`: an async load generator for a tiergate router or any OpenAI-compatible
server, reporting per tier served: TTFT, per-stream speed, throughput, cost per 1M output
tokens, tool-call error rate and escalations.

Layers: `workload` (what to send, pure and seeded) -> `client` (one request ->
`RequestResult`) -> `runner` (the run) -> `stats` (aggregation, pure) -> `report` (table,
JSON, chart); `command` is the CLI.
"""

from tiergate.bench.errors import BenchError
from tiergate.bench.results import RequestResult
from tiergate.bench.runner import BenchSettings, run_bench
from tiergate.bench.stats import BenchReport, RunInfo, TierStats, summarize
from tiergate.bench.workload import Workload, parse_mix

__all__ = [
    "BenchError",
    "BenchReport",
    "BenchSettings",
    "RequestResult",
    "RunInfo",
    "TierStats",
    "Workload",
    "parse_mix",
    "run_bench",
    "summarize",
]
