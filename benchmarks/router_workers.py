"""One router process against two (`tiergate router --workers 2`) on the same machine: the
router's CPU per request at 64 connections (all its processes), and the throughput.

Both routers share one PostgreSQL ledger (the tests' private server) and sit in front of the same
fixed-reply upstream (router_overhead.py's: the router's own cost), with one tenant that has a
budget and rate limits the run never reaches. Rounds alternate the order. Target: the CPU per
request with two workers within 10% of one's (the work is split, not added to).

    python -P benchmarks/router_workers.py [--rounds 7] [--duration 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))

from postgres_server import started_server  # noqa: E402  (the tests' private server)
from router_overhead import (  # noqa: E402
    LEDGER_TENANTS,
    Processes,
    Row,
    ensure_debian_tools,
    measure_round,
    run_wrk,
    start_fixed,
    start_router,
)

#: Two workers' CPU per request may exceed one's by at most this share.
TARGET_CPU_GROWTH = 0.10


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--duration", type=int, default=2, help="seconds per wrk run")
    p.add_argument("--connections", type=int, default=64)
    args = p.parse_args(argv)
    ensure_debian_tools({"wrk": "wrk"})
    postgres = started_server("tiergate-bench-pg-")
    procs = Processes(Path(tempfile.mkdtemp(prefix="tiergate-workers-")))
    try:
        key = "sk-bench-" + os.urandom(8).hex()
        tenants = procs.workdir / "tenants.yaml"
        tenants.write_text(LEDGER_TENANTS.format(key=key))
        dsn = postgres.dsn(postgres.create_database())
        upstream = start_fixed(procs, "fixed")
        rows = [
            Row(f"{n} worker{'s' if n > 1 else ''}",
                start_router(procs, f"router-{n}", [upstream.url], 256, ledger_url=dsn,
                             tenants_file=tenants, api_key=key, workers=n))
            for n in (1, 2)
        ]  # fmt: skip
        for row in rows:
            run_wrk(row.server.url, args.connections, 1, row.server.api_key)
        for i in range(args.rounds):
            for row in rows if i % 2 == 0 else rows[::-1]:
                measure_round(row, args, f"[workers] round {i + 1}/{args.rounds}")
        print(report(rows, args))
    finally:
        procs.stop_all()
        postgres.close()
    return 0


def report(rows: list[Row], args: argparse.Namespace) -> str:
    c = args.connections
    lines = [
        f"| router | req/s @{c} conns | CPU per request, all its processes (us) | errors |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r.label} | {r.rps():,.0f} | {r.cpu_us_per_request():.0f} | {r.errors()} |"
        for r in rows
    ]
    one, two = rows
    growth = two.cpu_us_per_request() / one.cpu_us_per_request() - 1
    pairs = zip(one.many, two.many, strict=True)
    round_growth = statistics.median(
        (b.cpu_s / max(b.requests, 1)) / (a.cpu_s / max(a.requests, 1)) - 1 for a, b in pairs
    )
    ok = growth <= TARGET_CPU_GROWTH
    lines += [
        "",
        f"Two workers against one: CPU per request {100 * growth:+.1f}% (round by round "
        f"{100 * round_growth:+.1f}%; target <= +{100 * TARGET_CPU_GROWTH:.0f}%: "
        f"{'met' if ok else '**not met**'}), throughput x{two.rps() / one.rps():.2f}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
