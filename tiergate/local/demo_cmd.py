"""`tiergate demo` (what `make demo` runs): `tiergate up` on the embedded default, a short
`tiergate bench` through it, the per-tier table, and everything stopped again.

The bench sends an even mix of every tier the router serves, so a short run shows each."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import httpx

from tiergate.bench.command import MAX_REQUESTS
from tiergate.bench.discovery import parse_model_list
from tiergate.bench.tenants import MAX_CONCURRENCY
from tiergate.common.cli import CliError, int_between
from tiergate.common.tiers import TIERS

ROUTER = "http://127.0.0.1:8080"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int_between(1, MAX_REQUESTS), default=60,
                   help=f"requests to send, at most {MAX_REQUESTS:,} (60)")  # fmt: skip
    p.add_argument("--concurrency", type=int_between(1, MAX_CONCURRENCY), default=6,
                   help=f"parallel streams, at most {MAX_CONCURRENCY:,} (6)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    up = subprocess.Popen(
        [sys.executable, "-P", "-m", "tiergate", "up", "--log-level", "error"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        print(_wait_until_up(up), flush=True)
        from tiergate.cli import main

        return main([
            "bench", "--router", ROUTER,
            "--requests", str(args.requests), "--concurrency", str(args.concurrency),
            "--mix", even_mix(httpx.get(ROUTER + "/v1/models", timeout=5).json()),
            "--tools-fraction", "0.5", "--max-tokens", "200",
        ])  # fmt: skip
    finally:
        up.terminate()
        try:
            up.wait(timeout=15)
        except subprocess.TimeoutExpired:
            up.kill()


def _wait_until_up(up: subprocess.Popen[str], timeout_s: float = 90.0) -> str:
    """The `tiergate up` summary, once the router answers /readyz."""
    assert up.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = up.stdout.readline()
        if not line:
            break  # exited
        lines.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C stops everything"):
            break
    while time.monotonic() < deadline and up.poll() is None:
        try:
            if httpx.get(ROUTER + "/readyz", timeout=1).status_code == 200:
                return "\n".join(lines[:-1])
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    detail = lines[-1] if lines else "no output"
    raise CliError(f"tiergate up did not become ready: {detail}")


def even_mix(model_list: Any) -> str:
    """A `--mix` giving each tier that `model_list` (the router's `GET /v1/models`) says it
    serves the same weight, in the tiers' own order."""
    served = {tier for model in parse_model_list(model_list) for tier in model.tiers or ()}
    tiers = [tier for tier in TIERS if tier in served]
    if not tiers:
        raise CliError("the router serves no tier (GET /v1/models lists none)")
    return ",".join(f"{tier}=1" for tier in tiers)
