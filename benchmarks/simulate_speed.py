"""Benchmark: wall time of the virtual-time simulator on one core.

The workload the engine's hot path is sized for: 100,000 requests of 1,000 prompt / 200
output tokens through one replica (llama-3.1-8b on one H100) with a batch cap of 64, arriving
fast enough to keep the batch full. That is 20M output tokens and ~310k steps. Runs several
rounds (workload generation excluded from the timing) and prints each round, the median and
the minimum. Not a test: the target (< 20 s) is printed next to the figure.

    .venv/bin/python benchmarks/simulate_speed.py [--rounds 5] [--requests 100000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.engine.simulation import simulate
from tiergate.sim_nodes.engine.workload import parse_length, poisson_workload
from tiergate.sim_nodes.perf import Batching, ServingSpec, build_deployment

TARGET_WALL_S = 20.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--prompt-tokens", default="1000")
    parser.add_argument("--output-tokens", default="200")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--rate", type=float, default=1000.0, help="arrivals/s (saturating)")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--accelerator", default="h100-sxm")
    args = parser.parse_args()

    pinned = "no"
    if hasattr(os, "sched_setaffinity"):
        # One core, so the figure does not depend on how busy the machine's other cores are.
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        pinned = f"core {core}"

    deployment = build_deployment(
        ServingSpec(model=args.model, accelerator=args.accelerator), default_catalog()
    )
    batching = Batching(max_num_seqs=args.max_num_seqs, max_batched_tokens=8192)
    workload = poisson_workload(
        args.requests,
        args.rate,
        parse_length(args.prompt_tokens),
        parse_length(args.output_tokens),
        random.Random(0),
    )
    print(
        f"{args.requests} requests ({args.prompt_tokens} in / {args.output_tokens} out) at "
        f"{args.rate:g}/s, {args.model} on {args.accelerator}, batch cap {args.max_num_seqs}, "
        f"pinned: {pinned}"
    )
    walls = []
    report = None
    for round_no in range(1, args.rounds + 1):
        start = time.perf_counter()
        report = simulate(deployment, batching, workload)
        wall = time.perf_counter() - start
        walls.append(wall)
        print(
            f"round {round_no}: {wall:6.2f} s wall, {report.steps} steps "
            f"({report.steps / wall:,.0f} steps/s, {report.output_tokens / wall / 1e6:.2f}M "
            "tokens/s of wall time)"
        )
    assert report is not None
    print(
        f"median {statistics.median(walls):.2f} s, min {min(walls):.2f} s "
        f"(target < {TARGET_WALL_S:.0f} s)"
    )
    print(
        f"simulated: {report.completed} completed in {report.duration_s:,.0f} s, "
        f"{report.output_tokens_per_s:,.0f} output tok/s, TPOT p50 "
        f"{report.tpot_p50_s * 1000:.2f} ms, TTFT p50 {report.ttft_p50_s:.1f} s, "
        f"{report.preemptions} preemptions"
    )


if __name__ == "__main__":
    main()
