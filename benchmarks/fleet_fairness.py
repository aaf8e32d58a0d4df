"""Fair share across three routers on one PostgreSQL ledger: each flooding tenant's share of
the tokens served and a light tenant's time to first token, with the routers exchanging their
fair-share claims (`router.fleetFairShareIntervalS`) and with each on its own.

Three `tiergate router` processes in front of one sim node of 8 slots (llama-3.1-8b on one
H100); tenants a, b and c (weights 1, 1, 2) flood through a router each, 12 clients each, and
a light tenant sends a 64-token prompt every 0.7 s or so through the first
(tests/router/fleet_fairness_helpers.py). Shares are counted over a 12 s window after 4 s of
warm-up, from the routers' `tiergate_tenant_attained_tokens_total` added up. The light
tenant's TTFT alone on the idle tier is measured first. The exchange's cost is read from the
routers' `tiergate_fair_share_exchanges_total` and `..._exchange_seconds_total`.

    python -P benchmarks/fleet_fairness.py [--rounds 3] [--interval 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "helpers"), str(HERE.parent / "tests" / "router")]

from fleet_fairness_helpers import FLOODERS, fleet, flooded, light_alone  # noqa: E402
from flood_clients import p90  # noqa: E402
from postgres_server import started_server  # noqa: E402


def exchange_cost(metrics_url: str) -> tuple[float, float]:
    """(exchanges that succeeded, seconds spent in them) from one router's /metrics."""
    count = seconds = 0.0
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=10).text):
        for sample in family.samples:
            if sample.name == "tiergate_fair_share_exchanges_total":
                if sample.labels.get("outcome") == "ok":
                    count = sample.value
            elif sample.name == "tiergate_fair_share_exchange_seconds_total":
                seconds = sample.value
    return count, seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.2, help="fleetFairShareIntervalS")
    p.add_argument("--headroom", type=int, default=0, help="headroomPerPool")
    args = p.parse_args(argv)
    postgres = started_server("tiergate-bench-pg-")
    results: dict[str, list[tuple[dict[str, float], float, float, float]]] = {}
    cost: list[tuple[float, float, float]] = []
    try:
        for mode, interval in (("fleet", args.interval), ("per process", None)):
            for _ in range(args.rounds):
                dsn = postgres.dsn(postgres.create_database())
                with (
                    tempfile.TemporaryDirectory(prefix="tiergate-fleet-fair-") as folder,
                    fleet(Path(folder), dsn, interval_s=interval, headroom=args.headroom) as f,
                ):
                    idle = p90(light_alone(f))
                    started = time.monotonic()
                    before = [exchange_cost(r.metrics_url) for r in f.routers]
                    found = asyncio.run(flooded(f))
                    after = [exchange_cost(r.metrics_url) for r in f.routers]
                    elapsed_s = time.monotonic() - started
                    results.setdefault(mode, []).append(
                        (found.shares, found.light_p90_s, idle, found.flood_tokens_per_s)
                    )
                    if interval is not None:
                        n = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
                        s = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
                        cost.append((n / elapsed_s / len(f.routers), s / max(n, 1), elapsed_s))
                    print(mode, found.shares, f"{found.flood_tokens_per_s:.0f} tok/s",
                          f"light p90 {found.light_p90_s * 1000:.0f} ms",
                          f"idle {idle * 1000:.0f} ms", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        postgres.close()
    print("| routers | " + " | ".join(f"share {t}" for t in FLOODERS)
          + " | flood tok/s | light TTFT p90 (ms) | light alone p90 (ms) |")  # fmt: skip
    print("|---|" + "---:|" * (len(FLOODERS) + 3))
    for mode, rows in results.items():
        median = {t: statistics.median(r[0].get(t, 0.0) for r in rows) for t in FLOODERS}
        light = statistics.median(r[1] for r in rows) * 1000
        idle = statistics.median(r[2] for r in rows) * 1000
        rate = statistics.median(r[3] for r in rows)
        print(f"| {mode} | " + " | ".join(f"{median[t]:.3f}" for t in FLOODERS)
              + f" | {rate:.0f} | {light:.0f} | {idle:.0f} |")  # fmt: skip
    if cost:
        per_s = statistics.median(c[0] for c in cost)
        rtt_ms = statistics.median(c[1] for c in cost) * 1000
        print(f"\nexchanges per second per router: {per_s:.2f} "
              f"(period {1 / per_s * 1000:.0f} ms); mean round trip {rtt_ms:.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
