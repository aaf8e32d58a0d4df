"""Benchmark: one real `tiergate sim-node` process streaming to many concurrent clients.

Starts the node as a subprocess on a free port (real socket), streams `--concurrency`
requests at once with httpx, and reports

* delivered tokens/s: completion tokens of all requests / wall time of the round;
* token-time error: for every SSE chunk, against the engine's scheduled release time of its
  tokens (the node stamps it, and the time it wrote the chunk, when asked with
  ``x-tiergate-timing: 1``): the node's own lateness (written - scheduled) and what the client
  sees (received - scheduled), which adds the Python client's own lag on this 2-core machine.
  All are `time.monotonic()` (CLOCK_MONOTONIC, system-wide on Linux), so they compare across
  processes.

Runs several rounds and prints each round and the median. Not a test: targets (>= 4,000
tokens/s, p99 error < 5 ms) are printed next to the figures.

    .venv/bin/python benchmarks/sim_node_stream.py [--rounds 5] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import httpx

TARGET_TOKENS_PER_S = 4000.0
TARGET_P99_ERROR_MS = 5.0
_STAMP = re.compile(rb'"tiergate":\{"t":([-0-9.e+]+),"w":([-0-9.e+]+)\}')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')


@dataclass
class Round:
    tokens: int = 0
    wall_s: float = 0.0
    errors_s: list[float] = field(default_factory=list)
    node_lag_s: list[float] = field(default_factory=list)
    failed: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    def error_ms(self, q: float) -> float:
        return _quantile_ms(self.errors_s, q)

    def node_lag_ms(self, q: float) -> float:
        return _quantile_ms(self.node_lag_s, q)


def _quantile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_node(args: argparse.Namespace) -> tuple[subprocess.Popen[str], int]:
    cmd = [
        sys.executable,
        "-P",  # never the repo root on sys.path: its operator/ would shadow the stdlib
        "-m",
        "tiergate",
        "sim-node",
        "--model",
        args.model,
        "--accelerator",
        args.accelerator,
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--port",
        "0",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening"):
        proc.kill()
        raise SystemExit(f"node did not start: {line!r}")
    port = int(dict(p.split("=", 1) for p in line.split()[1:])["port"])
    return proc, port


async def wait_ready(client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if (await client.get("/ready")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.05)
    raise SystemExit("node not ready after 30 s")


async def one_stream(client: httpx.AsyncClient, args: argparse.Namespace, out: Round) -> None:
    body = {
        "model": args.model,
        "prompt": "Benchmark the simulated node " * 8,
        "max_tokens": args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream(
        "POST", "/v1/completions", json=body, headers={"x-tiergate-timing": "1"}
    ) as response:
        if response.status_code != 200:
            out.failed += 1
            return
        # Raw bytes and a regex, not line splitting and json.loads: the client's own per-chunk
        # work would otherwise dominate the error being measured.
        pending = b""
        async for raw in response.aiter_raw():
            received = time.monotonic()
            pending += raw
            end = pending.rfind(b"\n\n") + 2
            if end < 2:
                continue
            complete, pending = pending[:end], pending[end:]
            for t, w in _STAMP.findall(complete):
                out.errors_s.append(received - float(t))
                out.node_lag_s.append(float(w) - float(t))
            usage = _COMPLETION_TOKENS.search(complete)
            if usage is not None:
                out.tokens += int(usage.group(1))


async def run_round(client: httpx.AsyncClient, args: argparse.Namespace) -> Round:
    out = Round()
    start = time.monotonic()
    await asyncio.gather(*(one_stream(client, args, out) for _ in range(args.concurrency)))
    out.wall_s = time.monotonic() - start
    return out


def worker_round(port: int, args: argparse.Namespace, streams: int, start_at: float) -> Round:
    """One client process's share of a round: `streams` streams, starting at `start_at`."""

    async def go() -> Round:
        limits = httpx.Limits(max_connections=streams + 4)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=120
        ) as client:
            # Open the connections before the common start, so setup is not measured.
            await asyncio.gather(*(client.get("/health") for _ in range(streams)))
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
            out = Round()
            await asyncio.gather(*(one_stream(client, args, out) for _ in range(streams)))
            out.wall_s = time.monotonic() - start_at
            return out

    return asyncio.run(go())


def run_round_in_processes(pool: ProcessPoolExecutor, port: int, args: argparse.Namespace) -> Round:
    """Streams spread over `args.client_processes` processes (one Python client process
    cannot read ~7,000 chunks/s without queueing, which would be measured as error)."""
    shares = [args.concurrency // args.client_processes] * args.client_processes
    shares[0] += args.concurrency - sum(shares)
    start_at = time.monotonic() + 1.0
    futures = [pool.submit(worker_round, port, args, n, start_at) for n in shares if n]
    out = Round()
    for future in futures:
        part = future.result()
        out.tokens += part.tokens
        out.failed += part.failed
        out.errors_s.extend(part.errors_s)
        out.node_lag_s.extend(part.node_lag_s)
        out.wall_s = max(out.wall_s, part.wall_s)
    return out


def main_processes(args: argparse.Namespace) -> list[Round]:
    proc, port = start_node(args)
    rounds = []
    try:
        with ProcessPoolExecutor(args.client_processes) as pool:
            asyncio.run(_wait_ready_at(port))
            warmup = argparse.Namespace(**{**vars(args), "max_tokens": 8})
            run_round_in_processes(pool, port, warmup)
            for i in range(args.rounds):
                r = run_round_in_processes(pool, port, args)
                rounds.append(r)
                print_round(i, r)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    return rounds


async def _wait_ready_at(port: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        await wait_ready(client)


def print_round(i: int, r: Round) -> None:
    print(
        f"round {i + 1}: {r.tokens} tokens in {r.wall_s:.2f} s = "
        f"{r.tokens_per_s:,.0f} tok/s; node lateness p50 {r.node_lag_ms(0.5):.2f} ms"
        f" p99 {r.node_lag_ms(0.99):.2f} ms; at the client p50 {r.error_ms(0.5):.2f} ms"
        f" p99 {r.error_ms(0.99):.2f} ms; {len(r.errors_s)} chunks"
        + (f"; {r.failed} failed" if r.failed else ""),
        flush=True,
    )


async def main_async(args: argparse.Namespace) -> list[Round]:
    proc, port = start_node(args)
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    rounds = []
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=120
        ) as client:
            await wait_ready(client)
            await run_round(client, argparse.Namespace(**{**vars(args), "max_tokens": 8}))
            for i in range(args.rounds):
                r = await run_round(client, args)
                rounds.append(r)
                print_round(i, r)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    return rounds


def summarize(rounds: list[Round]) -> None:
    tps = statistics.median(r.tokens_per_s for r in rounds)
    p50 = statistics.median(r.error_ms(0.5) for r in rounds)
    p99 = statistics.median(r.error_ms(0.99) for r in rounds)
    n50 = statistics.median(r.node_lag_ms(0.5) for r in rounds)
    n99 = statistics.median(r.node_lag_ms(0.99) for r in rounds)
    print(
        f"median of {len(rounds)} rounds: {tps:,.0f} tok/s "
        f"(target >= {TARGET_TOKENS_PER_S:,.0f})\n"
        f"token-time error, node (written - scheduled): p50 {n50:.2f} ms, p99 {n99:.2f} ms "
        f"(target p99 < {TARGET_P99_ERROR_MS} ms)\n"
        f"token-time error, client (received - scheduled, includes the Python client's own "
        f"lag): p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--accelerator", default="h100-sxm")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--client-processes",
        type=int,
        default=2,
        help="spread the streams over this many client processes",
    )
    args = parser.parse_args()
    if args.client_processes > 1:
        rounds = main_processes(args)
    else:
        rounds = asyncio.run(main_async(args))
    summarize(rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
