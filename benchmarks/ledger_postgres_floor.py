"""What one committed record costs a reply on the PostgreSQL ledger, against the round trips it
is made of: `SELECT 1`, the smallest write transaction (one row into one table), and the
ledger's own `add` + `committed()` (its batch statement: a row and its day's totals).

On the tests' private server (tests/helpers/postgres_server.py), one record at a time: the wait
a reply has at one connection. Medians of `--records` each, over `--rounds` rounds.

    python -P benchmarks/ledger_postgres_floor.py [--records 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

from postgres_server import started_server  # noqa: E402

from tiergate.router.ledger.postgres import PostgresLedger, open_check  # noqa: E402
from tiergate.router.ledger.records import UsageRecord  # noqa: E402

SMALLEST_WRITE = (
    "INSERT INTO usage (request_id, attempt, time_s, tenant, tier_requested, cost_usd,"
    " prompt_tokens, completion_tokens, latency_s, http_status, outcome, escalated)"
    " VALUES ($1, 1, 0, 'bench', 'batched', 0, 1, 1, 0, 200, 'ok', false)"
)


def record(i: int) -> UsageRecord:
    return UsageRecord(
        request_id=f"ledger-{i}", time_s=time.time(), tenant="bench",
        tier_requested="batched", tier_served="batched", pool="p", endpoint="e",
        prompt_tokens=1, completion_tokens=1, latency_s=0.0, ttft_s=None, cost_usd=0.001,
        http_status=200, outcome="ok",
    )  # fmt: skip


async def median_us(count: int, one: Callable[[int], Awaitable[object]]) -> float:
    times = []
    for i in range(count):
        started = time.perf_counter()
        await one(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def round_(dsn: str, count: int, n: int) -> dict[str, float]:
    conn = await asyncpg.connect(dsn)
    ledger = PostgresLedger(dsn)
    ledger.start()
    try:

        async def ledger_one(i: int) -> None:
            ledger.add(record(n * count + i))
            await ledger.committed()

        return {
            "SELECT 1": await median_us(count, lambda _: conn.fetchval("SELECT 1")),
            "one row, one table": await median_us(
                count, lambda i: conn.execute(SMALLEST_WRITE, f"small-{n}-{i}")
            ),
            "ledger add + committed()": await median_us(count, ledger_one),
        }
    finally:
        await ledger.stop()
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    server = started_server("tiergate-bench-pg-")
    try:
        dsn = server.dsn(server.create_database())
        asyncio.run(open_check(dsn))
        rounds = [asyncio.run(round_(dsn, args.records, n)) for n in range(args.rounds)]
    finally:
        server.close()
    print("| one at a time | median (us) [each round's] |\n|---|---:|")
    for name in rounds[0]:
        each = [r[name] for r in rounds]
        shown = ", ".join(f"{v:.0f}" for v in each)
        print(f"| {name} | {statistics.median(each):.0f} [{shown}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
