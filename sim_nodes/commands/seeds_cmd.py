"""`tiergate seeds`: the three February-2026 tiers as the performance model predicts them."""

from __future__ import annotations

import argparse
import json

from ..catalogs import default_catalog
from ..perf import evaluate_seed_tiers, load_seed_tiers
from .common import table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    seeds = load_seed_tiers()
    results = evaluate_seed_tiers(default_catalog(), seeds)
    if args.json:
        print(json.dumps({t: r.model_dump() for t, r in results.items()}, indent=2))
        return 0
    base = results["batched"]
    rows = []
    for tier, r in results.items():
        cost = r.cost_per_million_output_tokens_usd
        rows.append(
            [
                tier,
                r.model,
                f"{r.chips} x {r.accelerator}",
                str(r.running_sequences),
                f"{r.output_tokens_per_s_per_stream:.0f}",
                f"{r.output_tokens_per_s_per_stream / base.output_tokens_per_s_per_stream:.1f}x",
                f"{r.throughput_output_tokens_per_s:,.0f}",
                f"{cost:.2f}",
                f"{cost / base.cost_per_million_output_tokens_usd:.1f}x",
                f"{r.ttft_s * 1000:.0f}",
                f"{r.quality:.2f}",
            ]
        )
    w = seeds.workload
    print(
        f"Seed tiers, as the performance model predicts them for an agentic workload: "
        f"{w.input_tokens:,} tokens of context ({w.cached_input_tokens:,} cached), "
        f"{w.output_tokens:,} output tokens.\n"
    )
    headers = [
        "tier",
        "model",
        "hardware",
        "batch",
        "tok/s/stream",
        "speed",
        "throughput tok/s",
        "$/1M out",
        "cost",
        "TTFT ms",
        "quality",
    ]
    print(table(headers, rows, left=3))
    print(
        "\nspeed and cost are relative to batched; quality is the probability a tool call is "
        "well-formed and right.\nWhy: `tiergate perf --model frontier --accelerator b200 --chips 8 "
        "--weight-dtype fp8 --input-tokens 30000 --cached-input-tokens 27000 "
        "--output-tokens 1000 --concurrency 60` shows the step breakdown."
    )
    return 0
