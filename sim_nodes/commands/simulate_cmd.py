"""`tiergate simulate`: replay a workload through N replicas in virtual time.

The deployment is built from the same flags and `ServingSpec` as `tiergate perf`, so names
and validation are shared; the batching engine then schedules every request step by step.
"""

from __future__ import annotations

import argparse
import random

from tiergate.common.cli import CliError, int_between, non_negative_int, positive_float, table

from ..catalogs import default_catalog
from ..engine.errors import EngineError
from ..engine.simulation import SimulationReport, simulate
from ..engine.workload import (
    MAX_RATE_PER_S,
    MIN_RATE_PER_S,
    LengthDistribution,
    WorkloadError,
    WorkloadRequest,
    load_trace,
    parse_length,
    poisson_workload,
)
from ..perf import build_deployment
from .serving_args import add_serving_arguments, short_of_context, spec_from_args

#: vLLM's default batch cap.
DEFAULT_MAX_NUM_SEQS = 256
#: The most replicas and requests one run may ask for: far past any real deployment, and
#: bounded so that a typo is an error, not a run that fills memory or never ends (a million
#: requests take about a minute and under 1 GB).
MAX_REPLICAS = 10_000
MAX_REQUESTS = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `tiergate simulate`."""
    add_serving_arguments(p, max_num_seqs=DEFAULT_MAX_NUM_SEQS)
    p.add_argument(
        "--replicas",
        type=int_between(1, MAX_REPLICAS),
        default=1,
        help=f"replicas (least-loaded), at most {MAX_REPLICAS:,}",
    )
    p.add_argument(
        "--requests",
        type=int_between(1, MAX_REQUESTS),
        default=None,
        help=f"requests to simulate, at most {MAX_REQUESTS:,} (default 1000; with --trace: "
        "the whole trace)",
    )
    arrivals = p.add_mutually_exclusive_group()
    arrivals.add_argument(
        "--rate",
        type=positive_float,
        default=None,
        help=f"Poisson arrivals per second, {MIN_RATE_PER_S:g} to {MAX_RATE_PER_S:,.0f} "
        "(default: all arrive at once)",
    )
    arrivals.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="JSONL lines of {arrival_s, prompt_tokens, output_tokens}",
    )
    p.add_argument(
        "--prompt-tokens",
        default="1024",
        metavar="SPEC",
        help="N, uniform:A:B or lognormal:MEAN:SIGMA (default 1024)",
    )
    p.add_argument(
        "--output-tokens",
        default="256",
        metavar="SPEC",
        help="N, uniform:A:B or lognormal:MEAN:SIGMA (default 256)",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed")
    p.add_argument("--slo-ttft-ms", type=positive_float, default=None, help="TTFT SLO, ms")
    p.add_argument("--slo-tpot-ms", type=positive_float, default=None, help="TPOT SLO, ms")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """Build the deployment and workload, simulate, print the report."""
    workload = _workload(args)
    spec = spec_from_args(args)
    longest = max(r.prompt_tokens + r.output_tokens for r in workload)
    # Size `--chips auto` so that the longest request fits (SRAM chips hold KV too).
    deployment = build_deployment(spec, default_catalog(), kv_tokens=longest)
    if not deployment.weights_fit:
        gb = 1e9
        raise CliError(
            f"{deployment.model.name} does not fit: weights need "
            f"{deployment.weight_bytes_per_chip / gb:.1f} GB per chip but "
            f"{deployment.accelerator.name} offers "
            f"{deployment.accelerator.usable_bytes_per_chip / gb:.1f} GB usable on each of "
            f"{deployment.chips} chips"
        )
    if not deployment.holds_its_context:
        raise CliError(
            f"{deployment.model.name} on {deployment.chips} x {deployment.accelerator.name} "
            f"does not fit: {short_of_context(deployment, spec)}"
        )
    try:
        report = simulate(
            deployment,
            spec.batching.to_batching(),
            workload,
            replicas=args.replicas,
            slo_ttft_s=None if args.slo_ttft_ms is None else args.slo_ttft_ms / 1000.0,
            slo_tpot_s=None if args.slo_tpot_ms is None else args.slo_tpot_ms / 1000.0,
            seed=args.seed,
        )
    except EngineError as exc:
        raise CliError(str(exc)) from None
    if report.completed == 0:
        raise CliError(f"no request can run: {report.first_rejection}")
    print(report.model_dump_json(indent=2) if args.json else render(report))
    return 0


def _workload(args: argparse.Namespace) -> list[WorkloadRequest]:
    try:
        if args.trace is not None:
            return load_trace(args.trace, limit=args.requests)
        prompt = _length("--prompt-tokens", args.prompt_tokens)
        output = _length("--output-tokens", args.output_tokens)
        requests = args.requests if args.requests is not None else 1000
        return poisson_workload(requests, args.rate, prompt, output, random.Random(args.seed))
    except WorkloadError as exc:
        raise CliError(str(exc)) from None


def _length(flag: str, text: str) -> LengthDistribution:
    try:
        return parse_length(text)
    except WorkloadError as exc:
        raise CliError(f"{flag}: {exc}") from None


def render(r: SimulationReport) -> str:
    """The human-readable report."""
    ms = 1000.0
    batching = (
        f"batch cap {r.max_num_seqs}, step budget {r.max_batched_tokens} tokens, "
        f"{'chunked' if r.chunked_prefill else 'whole'} prefill"
    )
    lines = [
        f"{r.model} on {r.chips} x {r.accelerator} (tensor parallel {r.tensor_parallel}), "
        f"{r.replicas} replica{'s' if r.replicas > 1 else ''}; {batching}",
        f"{r.requests} requests: {r.completed} completed, {r.rejected} rejected, in "
        f"{r.duration_s:.1f} s simulated ({r.steps} steps, {r.preemptions} preemptions)",
        "",
        _percentiles(r, ms),
        "",
        f"throughput   {r.output_tokens_per_s:,.1f} output tok/s, {r.requests_per_s:.2f} req/s",
        f"goodput      {r.goodput_requests_per_s:.2f} req/s{_slo(r)}",
        f"cost         ${r.cost_per_million_output_tokens_usd:.3f} per 1M output tokens "
        f"(${r.cost_per_hour_usd:.2f}/h)",
    ]
    return "\n".join(lines)


def _percentiles(r: SimulationReport, ms: float) -> str:
    rows = [
        ["time to first token (ms)"]
        + [f"{v * ms:.1f}" for v in (r.ttft_p50_s, r.ttft_p90_s, r.ttft_p99_s)],
        ["time per output token (ms)"]
        + [f"{v * ms:.2f}" for v in (r.tpot_p50_s, r.tpot_p90_s, r.tpot_p99_s)],
        ["end to end (s)", f"{r.e2e_p50_s:.2f}", "", f"{r.e2e_p99_s:.2f}"],
    ]
    return table(["latency", "p50", "p90", "p99"], rows)


def _slo(r: SimulationReport) -> str:
    parts = []
    if r.slo_ttft_s is not None:
        parts.append(f"TTFT <= {r.slo_ttft_s * 1000:g} ms")
    if r.slo_tpot_s is not None:
        parts.append(f"TPOT <= {r.slo_tpot_s * 1000:g} ms")
    return f" meeting {' and '.join(parts)}" if parts else " (no SLO set)"
