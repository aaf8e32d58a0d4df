"""Benchmark: the cost of a ledger record (committed alone, or in a group), and the WAL's size.

Writes `--records` usage rows after 1,000 warm-up ones, paced like a busy router (bursts of
`--burst` records, then 10 ms: ~2,700 records/s here), with the ledger's checkpoint thread
running, into:
- a new ledger file (the router's page size, `PAGE_SIZE`);
- a ledger file created with SQLite's default 4096-byte pages (as ledgers made before the
  change were), to show what the page size changes;
- an in-memory ledger (no file, no checkpoints);
- new files written as the router writes (group commit, router/ledger/sqlite.py): `Ledger.add` for
  `--groups` records at a time, then `await committed()`, as one event-loop round does;
- the same for streams: a stream's row is added at its first token and amended at its end, so
  each round adds the rows of a group of new streams and amends those of the group before.

For each: CPU per record (the whole process, so the checkpoint thread's share is in it), wall
time per record p50 / p99 / max (for groups: per group, which is what each of its requests
waits), and the largest WAL file seen. Then, on the new file, what
retention costs (router/ledger/retention.py): the rows are pruned in its batches of
`BATCH_ROWS`, oldest first, and each batch is timed: that is how long it holds the event loop.
Not a test: the figures go into benchmarks/README.md.

    .venv/bin/python -P benchmarks/ledger_record.py [--records 19000] [--rounds 3]
        [--groups 4,16] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sqlite3
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tiergate.router.ledger.retention import BATCH_ROWS
from tiergate.router.ledger.sqlite import Ledger, LedgerEntry, UsageRecord

WARM_UP = 1_000


def _record(index: int) -> UsageRecord:
    return UsageRecord(
        request_id=f"{index:032x}",  # the router's ids are uuid4 hex
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


@dataclass
class Run:
    cpu_us: float  # process CPU per record
    p50_us: float
    p99_us: float
    max_ms: float
    wal_max_mb: float


def measure(path: str, records: int, burst: int, group: int = 0, streams: bool = False) -> Run:
    """`records` rows after the warm-up: each committed alone (`record`) when `group` is 0,
    else `group` at a time (`add`, then `await committed()`, as one loop round of a busy router
    does); with `streams`, each row is added as `incomplete` and amended a round later. Times
    are per record, or per group: what each of its requests waits."""
    rows = [_record(index) for index in range(WARM_UP + records)]
    with Ledger(path) as ledger:
        for row in rows[:WARM_UP]:
            ledger.record(row)
        return asyncio.run(_timed(ledger, rows[WARM_UP:], burst, group, streams))


async def _timed(
    ledger: Ledger, rows: list[UsageRecord], burst: int, group: int, streams: bool
) -> Run:
    step = group or 1
    each_s = []
    wal_max = 0
    since_pause = 0
    started: list[
        tuple[LedgerEntry, UsageRecord]
    ] = []  # streams whose first token was billed last round
    first_tokens = (
        [dataclasses.replace(row, outcome="incomplete") for row in rows] if streams else []
    )
    cpu0 = time.process_time()
    for n in range(0, len(rows), step):
        start = time.perf_counter()
        if streams:
            for entry, row in started:
                ledger.amend(entry, row)
            started = [
                (ledger.add(first_tokens[i]), rows[i]) for i in range(n, min(n + group, len(rows)))
            ]
            await ledger.committed()
        elif group:
            for row in rows[n : n + group]:
                ledger.add(row)
            await ledger.committed()
        else:
            ledger.record(rows[n])
        each_s.append(time.perf_counter() - start)
        since_pause += step
        if since_pause >= burst:  # bursts of `burst` records, then 10 ms
            since_pause -= burst
            wal_max = max(wal_max, ledger.wal_bytes())
            time.sleep(0.01)
    cpu_s = time.process_time() - cpu0
    each_s.sort()
    return Run(
        cpu_us=cpu_s / len(rows) * 1e6,
        p50_us=each_s[len(each_s) // 2] * 1e6,
        p99_us=each_s[int(len(each_s) * 0.99)] * 1e6,
        max_ms=each_s[-1] * 1e3,
        wal_max_mb=wal_max / 1e6,
    )


@dataclass
class Prune:
    batch_p50_ms: float  # one batch of BATCH_ROWS: the event loop is held this long
    batch_max_ms: float
    row_us: float  # wall time per row deleted


def measure_prune(path: str) -> Prune:
    """Prune every row of the ledger at `path`, oldest first, in the retention's batches."""
    each_s = []
    deleted = 0
    with Ledger(path) as ledger:
        while True:
            start = time.perf_counter()
            n = ledger.prune(BATCH_ROWS)
            each_s.append(time.perf_counter() - start)
            deleted += n
            if n < BATCH_ROWS:
                break
    full = sorted(each_s[:-1]) or each_s  # the last batch is partial
    return Prune(
        batch_p50_ms=full[len(full) // 2] * 1e3,
        batch_max_ms=max(each_s) * 1e3,
        row_us=sum(each_s) / max(1, deleted) * 1e6,
    )


def old_ledger_file(path: Path) -> str:
    """An empty database with SQLite's default page size, which the ledger then adopts."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA page_size=4096")
        db.execute("VACUUM")  # writes the header, fixing the page size
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=19_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=30, help="records between 10 ms pauses")
    parser.add_argument("--dir", default=None, help="where the file databases go (a temp dir)")
    parser.add_argument(
        "--groups", default="4,16", help="records per group commit (comma-separated)"
    )
    args = parser.parse_args()
    groups = [int(g) for g in args.groups.split(",") if g]
    kinds = (
        "new file",
        "4096-byte pages",
        "in memory",
        *(f"new file, groups of {g}" for g in groups),
        *(f"new file, streams in groups of {g}" for g in groups),
    )
    runs: dict[str, list[Run]] = {kind: [] for kind in kinds}
    prunes: list[Prune] = []
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory(dir=args.dir) as directory:
            paths = {
                "new file": str(Path(directory) / "new.db"),
                "4096-byte pages": old_ledger_file(Path(directory) / "old.db"),
                "in memory": ":memory:",
            }
            for g in groups:
                paths[f"new file, groups of {g}"] = str(Path(directory) / f"group-{g}.db")
                paths[f"new file, streams in groups of {g}"] = str(Path(directory) / f"s-{g}.db")
            for kind in kinds:  # interleaved, round by round
                group = int(kind.rsplit(" ", 1)[1]) if "groups of" in kind else 0
                run = measure(paths[kind], args.records, args.burst, group, "streams" in kind)
                runs[kind].append(run)
                print(
                    f"round {round_ + 1}/{args.rounds} {kind}: cpu {run.cpu_us:.1f} us/record, "
                    f"p50 {run.p50_us:.1f} us, p99 {run.p99_us:.1f} us, max {run.max_ms:.1f} ms, "
                    f"WAL up to {run.wal_max_mb:.1f} MB",
                    flush=True,
                )
            prune = measure_prune(paths["new file"])
            prunes.append(prune)
            print(
                f"round {round_ + 1}/{args.rounds} pruning the new file in batches of "
                f"{BATCH_ROWS}: p50 {prune.batch_p50_ms:.2f} ms, max {prune.batch_max_ms:.2f} ms "
                f"a batch, {prune.row_us:.2f} us a row",
                flush=True,
            )
    print(f"\nmedians of {args.rounds} rounds, {args.records:,} records each:\n")
    print("| ledger | CPU per record (us) | p50 (us) | p99 (us) | max (ms) | largest WAL (MB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in kinds:
        rs = runs[kind]

        def med(field: str, rs: list[Run] = rs) -> float:
            return statistics.median(getattr(r, field) for r in rs)

        print(
            f"| {kind} | {med('cpu_us'):.1f} | {med('p50_us'):.1f} | {med('p99_us'):.1f} | "
            f"{med('max_ms'):.1f} | {med('wal_max_mb'):.1f} |"
        )

    p50 = statistics.median(p.batch_p50_ms for p in prunes)
    top = statistics.median(p.batch_max_ms for p in prunes)
    per_row = statistics.median(p.row_us for p in prunes)
    print(
        f"\npruning ({BATCH_ROWS} rows a batch, {WARM_UP + args.records:,} rows): "
        f"p50 {p50:.2f} ms, max {top:.2f} ms a batch; {per_row:.2f} us a row"
    )


if __name__ == "__main__":
    main()
