"""`tiergate bench`: drive load through a tiergate router (or any OpenAI-compatible URL)
and print, per tier served, latency, speed, throughput, cost, tool-call errors, escalations;
with --tenants, also each tenant's share of the tokens served and its TTFT.

Exit status: 0 when the run completed (some requests may have failed: see the table), 1 when
every request failed, 2 for a user error (bad flags, unreachable URL, --plot without
matplotlib), each as one line on stderr, 130 when Ctrl-C (or SIGTERM) stopped it: the report
then covers the requests that finished, and is written to --json / --plot as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tiergate.bench.errors import BenchError, BenchInterrupted
from tiergate.bench.progress import make_progress
from tiergate.bench.report import render_table, require_matplotlib, write_json, write_plot
from tiergate.bench.results import RequestResult
from tiergate.bench.runner import BenchSettings, normalize_url, run_bench
from tiergate.bench.stats import BenchReport, SloTargets
from tiergate.bench.tenants import MAX_CONCURRENCY, BenchTenant, load_tenants
from tiergate.bench.workload import DEFAULT_MIX, Workload, parse_max_tokens, parse_mix
from tiergate.common.cli import (
    int_between,
    non_negative_float,
    positive_float,
    positive_int,
    unit_interval,
)

__all__ = ["API_KEY_ENV", "DEFAULT_ROUTER", "MAX_REQUESTS", "add_arguments", "run"]

DEFAULT_ROUTER = "http://127.0.0.1:8080"
API_KEY_ENV = "TIERGATE_API_KEY"
DEFAULT_REQUESTS = 100
#: The most --requests may ask for: hours of load at any rate a bench can send.
MAX_REQUESTS = 10_000_000
DEFAULT_CONCURRENCY = 8
#: The exit status of a run stopped by a signal (128 + SIGINT, as shells report Ctrl-C).
INTERRUPTED = 130
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's flags."""
    target = parser.add_argument_group("target")
    target.add_argument(
        "--router",
        default=DEFAULT_ROUTER,
        metavar="URL",
        help=f"base URL (default {DEFAULT_ROUTER})",
    )
    target.add_argument(
        "--model",
        help="model to ask for (default: per tier, one the router lists for it in "
        "GET /v1/models; a plain server's first model)",
    )
    target.add_argument(
        "--api-key", help=f"bearer API key (default: ${API_KEY_ENV}; none if unset)"
    )
    target.add_argument(
        "--tenants", type=Path, metavar="FILE",
        help="send as several tenants: a YAML file of tenants, each with its key and "
        "concurrency (docs/tutorials/local.md); replaces --api-key and --concurrency and adds a "
        "per-tenant table of the service each got",
    )  # fmt: skip
    target.add_argument(
        "--timeout", type=positive_float, default=120.0, metavar="S",
        help="seconds one request may take, stream included (default 120)",
    )  # fmt: skip
    load = parser.add_argument_group("load")
    load.add_argument(
        "--requests", type=int_between(1, MAX_REQUESTS), metavar="N",
        help=f"requests in all, tenants together, at most {MAX_REQUESTS:,} (default "
        f"{DEFAULT_REQUESTS}; with --duration: no limit)",
    )  # fmt: skip
    load.add_argument(
        "--duration", type=positive_float, metavar="S",
        help="stop sending after S seconds (requests in flight then finish and are counted)",
    )  # fmt: skip
    load.add_argument(
        "--concurrency", type=int_between(1, MAX_CONCURRENCY), metavar="N",
        help=f"requests in flight at once, at most {MAX_CONCURRENCY:,} (default "
        f"{DEFAULT_CONCURRENCY})",
    )  # fmt: skip
    load.add_argument(
        "--pause", type=non_negative_float, default=0.0, metavar="S",
        help="seconds each worker waits after a reply before its next request (default 0: "
        "back to back)",
    )  # fmt: skip
    load.add_argument("--mix", default=DEFAULT_MIX, help=f"tier weights (default {DEFAULT_MIX})")
    load.add_argument(
        "--tools-fraction", type=unit_interval, default=0.2, metavar="F",
        help="share of requests calling a tool, whose call is validated (default 0.2)",
    )  # fmt: skip
    load.add_argument(
        "--input-tokens", type=positive_int, default=512, metavar="N",
        help="prompt tokens per request, about (default 512)",
    )  # fmt: skip
    load.add_argument(
        "--max-tokens", default="128", metavar="N|LOW-HIGH",
        help="output tokens per request, or a range each request's is drawn from (default "
        "128; tool requests get at least 64)",
    )  # fmt: skip
    load.add_argument("--seed", type=int, default=0, help="seed of tiers, prompts, tool draws")
    slo = parser.add_argument_group("service level (adds the share of requests within it)")
    slo.add_argument(
        "--slo-ttft-ms", type=positive_float, metavar="MS",
        help="time to first token a request must not exceed",
    )  # fmt: skip
    slo.add_argument(
        "--slo-tpot-ms", type=positive_float, metavar="MS",
        help="time per output token (after the first) a request must not exceed",
    )  # fmt: skip
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    out.add_argument(
        "--requests-jsonl", type=Path, metavar="FILE",
        help="write one JSON line per request as it finishes (when it was sent, tier, pool, "
        "status, TTFT, e2e, tokens): figures over any stretch of a long run",
    )  # fmt: skip
    out.add_argument(
        "--plot", type=Path, metavar="FILE.png",
        help="chart speed vs cost per tier (needs: pip install 'tiergate[plot]')",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run the bench as `args` say; print the table (stdout) and progress (stderr)."""
    tenants: list[BenchTenant] = []
    if args.tenants is not None:
        for flag, value in (("--concurrency", args.concurrency), ("--api-key", args.api_key)):
            if value is not None:
                raise BenchError(f"{flag} cannot be given with --tenants: each tenant has its own")
        tenants = load_tenants(args.tenants)
    requests = args.requests
    if requests is None and args.duration is None:
        requests = DEFAULT_REQUESTS
    min_max_tokens, max_tokens = parse_max_tokens(args.max_tokens)
    workload = Workload(
        mix=parse_mix(args.mix),
        input_tokens=args.input_tokens,
        max_tokens=max_tokens,
        min_max_tokens=min_max_tokens,
        tools_fraction=args.tools_fraction,
        seed=args.seed,
    )
    settings = BenchSettings(
        url=normalize_url(args.router),
        requests=requests,
        concurrency=args.concurrency or DEFAULT_CONCURRENCY,
        workload=workload,
        model=args.model,
        api_key=None if tenants else args.api_key or os.environ.get(API_KEY_ENV) or None,
        timeout_s=args.timeout,
        duration_s=args.duration,
        tenants=tuple(tenants),
        pause_s=args.pause,
        slo=(
            None
            if args.slo_ttft_ms is None and args.slo_tpot_ms is None
            else SloTargets(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)
        ),
    )
    # Fail before sending load, not after it.
    for flag, path in (
        ("--json", args.json),
        ("--plot", args.plot),
        ("--requests-jsonl", args.requests_jsonl),
    ):
        if path is not None:
            _check_writable(flag, path)
    if args.plot is not None:
        if not args.plot.suffix:
            raise BenchError(f"--plot {args.plot}: name an image file, such as {args.plot}.png")
        require_matplotlib()

    progress = make_progress(settings.requests, duration_s=settings.duration_s)
    with contextlib.ExitStack() as stack:
        on_result: Callable[[RequestResult], None] = progress.update
        if args.requests_jsonl is not None:
            lines = stack.enter_context(args.requests_jsonl.open("w", encoding="utf-8"))
            on_result = _also_logged(progress.update, lines)
        try:
            report = asyncio.run(_run_until_interrupted(settings, on_result))
        except BenchInterrupted as exc:
            print(f"tiergate bench: {exc}", file=sys.stderr)
            return INTERRUPTED
        finally:
            progress.close()
    print(render_table(report))
    if args.json is not None:
        write_json(report, args.json)
    if args.plot is not None:
        try:
            write_plot(report, args.plot)
        except BenchError as exc:
            if not report.run.interrupted:
                raise
            print(f"tiergate bench: {exc}", file=sys.stderr)  # a short run may have no point
    if report.run.interrupted:
        return INTERRUPTED
    return 1 if report.total.errors == report.total.requests else 0


def _also_logged(
    update: Callable[[RequestResult], None], lines: TextIO
) -> Callable[[RequestResult], None]:
    """`update`, and the result written as one JSON line (flushed: a reader may follow it)."""

    def on_result(result: RequestResult) -> None:
        update(result)
        lines.write(json.dumps(dataclasses.asdict(result)) + "\n")
        lines.flush()

    return on_result


async def _run_until_interrupted(
    settings: BenchSettings, on_result: Callable[[RequestResult], None]
) -> BenchReport:
    """The bench, stopped by the first SIGINT (Ctrl-C) or SIGTERM with a report of what
    finished; a second one interrupts at once, as usual."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def first_signal() -> None:
        stop.set()
        for signum in SIGNALS:  # the next one is Python's own again
            loop.remove_signal_handler(signum)

    for signum in SIGNALS:
        loop.add_signal_handler(signum, first_signal)
    try:
        return await run_bench(settings, on_result=on_result, stop=stop)
    finally:
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)


def _check_writable(flag: str, path: Path) -> None:
    """BenchError unless `path` can be written (created, or appended to and left unchanged)."""
    if path.is_dir():
        raise BenchError(f"{flag} {path}: is a directory")
    if not path.parent.is_dir():
        raise BenchError(f"{flag}: no such directory: {path.parent}")
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise BenchError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)
