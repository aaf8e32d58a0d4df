"""How far a burst over three routers on one PostgreSQL ledger goes past a tenant's budget and
rate limit, against the bounds docs/concepts/budgets.md states, and what the same burst does
to three routers each on its own SQLite ledger.

Each round gives a fresh tenant a budget of 40 requests' holds (or 60 requests a minute) and
sends it 300 requests at once, round robin over the three routers, every other one a stream
(tests/router/fleet_helpers.py's fleet: real router and sim-node processes).

    python -P benchmarks/fleet_overshoot.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "helpers"), str(HERE.parent / "tests" / "router")]

from fleet_clients import burst  # noqa: E402
from fleet_helpers import fleet, hold_usd, tenant_yaml  # noqa: E402
from postgres_server import started_server  # noqa: E402

MAX_TOKENS = 4
HOLD_USD = hold_usd(MAX_TOKENS)
BUDGET_USD = 40 * HOLD_USD
RPM = 60
BURST = 300
ROUTERS = 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    budget_names = [f"budget{i}" for i in range(args.rounds)]
    rate_names = [f"rate{i}" for i in range(args.rounds)]
    tenants = [tenant_yaml(n, budgetUsd=BUDGET_USD, budgetPeriod="day") for n in budget_names]
    tenants += [tenant_yaml(n, requestsPerMinute=RPM) for n in rate_names]
    postgres = started_server("tiergate-bench-pg-")
    rows = []
    try:
        for mode, shared in (("PostgreSQL, shared", True), ("SQLite, one each", False)):
            dsn = postgres.dsn(postgres.create_database()) if shared else None
            overs, rates = [], []
            with (
                tempfile.TemporaryDirectory(prefix="tiergate-fleet-") as folder,
                fleet(Path(folder), tenants, dsn) as three,
            ):
                for i in range(args.rounds):
                    asyncio.run(burst(three.urls, budget_names[i], BURST, MAX_TOKENS))
                    overs.append(three.spent_usd(budget_names[i]) - BUDGET_USD)
                    started = time.monotonic()
                    replies = asyncio.run(burst(three.urls, rate_names[i], BURST, MAX_TOKENS))
                    elapsed_s = time.monotonic() - started
                    admitted = sum(r.status == 200 for r in replies)
                    rates.append(admitted - (RPM + RPM * elapsed_s / 60))
                    print(
                        f"[{mode}] round {i + 1}: budget overshoot ${overs[-1]:+.3f}, "
                        f"rate {admitted} admitted ({rates[-1]:+.1f} against its bound)"
                    )
            rows.append((mode, overs, rates))
    finally:
        postgres.close()
    bound = ROUTERS * HOLD_USD
    print(
        f"\nBudget ${BUDGET_USD:.3f} (a hold is ${HOLD_USD:.3f}; stated bound: +${bound:.3f}, "
        f"one hold per router); {RPM} requests a minute (bound: {RPM} plus the refill over "
        f"the burst). {BURST} requests at once over {ROUTERS} routers, {args.rounds} rounds.\n"
    )
    print("| ledger | budget overshoot, median [max] (USD) | admitted past the rate's bound, "
          "median [max] (requests) |")  # fmt: skip
    print("|---|---:|---:|")
    for mode, overs, rates in rows:
        print(f"| {mode} | {statistics.median(overs):+.3f} [{max(overs):+.3f}] "
              f"| {statistics.median(rates):+.1f} [{max(rates):+.1f}] |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
