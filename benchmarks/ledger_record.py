"""Benchmark: the cost of one `Ledger.record` (one committed transaction) on a file and in memory.

Writes `--records` usage rows after 1,000 warm-up ones and prints the mean, p50, p99 and maximum
per record. The maximum is a WAL checkpoint, which SQLite runs inline in the commit that crosses
~1,000 pages of WAL. Not a test: the figures go into `router/ledger.py`'s docstring.

    .venv/bin/python -P benchmarks/ledger_record.py [--records 19000] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tiergate.router.ledger import Ledger, UsageRecord

WARM_UP = 1_000


def _record(index: int) -> UsageRecord:
    return UsageRecord(
        request_id=f"req-{index:08x}",
        time_s=1.8e9 + index,
        tenant=f"team-{index % 5}",
        tier_requested="batched",
        tier_served="premium",
        pool="premium-a",
        endpoint="http://127.0.0.1:9001",
        prompt_tokens=1200,
        completion_tokens=300,
        latency_s=1.5,
        ttft_s=0.2,
        cost_usd=0.0123,
        http_status=200,
        outcome="ok",
    )


def measure(path: str, records: int) -> str:
    """One run; returns the line to print."""
    rows = [_record(index) for index in range(WARM_UP + records)]
    with Ledger(path) as ledger:
        for row in rows[:WARM_UP]:
            ledger.record(row)
        each_s = []
        for row in rows[WARM_UP:]:
            start = time.perf_counter()
            ledger.record(row)
            each_s.append(time.perf_counter() - start)
    each_s.sort()
    mean_us = statistics.fmean(each_s) * 1e6
    p50_us = each_s[len(each_s) // 2] * 1e6
    p99_us = each_s[int(len(each_s) * 0.99)] * 1e6
    max_us = each_s[-1] * 1e6
    return f"{path}: mean {mean_us:.1f} us  p50 {p50_us:.1f}  p99 {p99_us:.1f}  max {max_us:.0f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=19_000)
    parser.add_argument("--dir", default=None, help="where the file database goes (a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        print(measure(str(Path(directory) / "ledger.db"), args.records))
    print(measure(":memory:", args.records))


if __name__ == "__main__":
    main()
