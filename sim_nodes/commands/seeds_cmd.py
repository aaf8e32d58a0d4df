"""`tiergate seeds`: the three February-2026 tiers as the performance model predicts them."""

from __future__ import annotations

import argparse
import json

from tiergate.common.cli import table
from tiergate.common.tiers import DEFAULT_TIER

from ..catalogs import default_catalog
from ..perf import evaluate_seed_tiers, load_seed_tiers
from ..perf.seeds import SeedFile, SeedTier


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    seeds = load_seed_tiers()
    results = evaluate_seed_tiers(default_catalog(), seeds)
    if args.json:
        print(json.dumps({t: r.model_dump() for t, r in results.items()}, indent=2))
        return 0
    base = results[DEFAULT_TIER]
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
        f"\nspeed and cost are relative to {DEFAULT_TIER}; quality is the probability a tool "
        "call is well-formed and right."
    )
    base_tier = next(t for t in seeds.tiers if t.tier == DEFAULT_TIER)
    print(f"Why: `{perf_command(base_tier, seeds)}` shows the step broken into its terms.")
    return 0


def perf_command(tier: SeedTier, seeds: SeedFile) -> str:
    """The `tiergate perf` invocation that reproduces one seed tier's row."""
    w = seeds.workload
    return (
        f"tiergate perf --model {tier.model} --accelerator {tier.accelerator} "
        f"--chips {tier.chips} --weight-dtype {tier.weight_dtype} --kv-dtype {tier.kv_dtype} "
        f"--max-num-seqs {tier.batching.max_num_seqs} --concurrency {tier.concurrency} "
        f"--input-tokens {w.input_tokens} --cached-input-tokens {w.cached_input_tokens} "
        f"--output-tokens {w.output_tokens}"
    )
